/* Runs tree_sample_accept on the CUDA backend for params in host memory (tests only): inputs
 * copied to the device, outputs poisoned there, results copied back into the host outputs. */
#pragma once

#include "kdt/ops.h"

kdt_status kt_sample_accept_on_device(const kdt_tree_sample_accept_params *host);
