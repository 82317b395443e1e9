#!/usr/bin/env bash
# Checks what `make test` (or, given "demo", scripts/demo.sh) needs before anything is built, and
# names whatever is missing in one line with the command that installs it, instead of a compiler
# error or a Python traceback later. The lists match the README and .ci/run.
#   bash scripts/check_deps.sh [test|demo]       exit 1 when something is missing
set -u
cd "$(dirname "$0")/.."
what=${1:-test}
cc=${CC:-cc}
apt=() pip=()
command -v make >/dev/null 2>&1 || apt+=(make)
command -v "$cc" >/dev/null 2>&1 || apt+=(gcc)
if [ "$what" = test ] && ! command -v "${CXX:-g++}" >/dev/null 2>&1; then apt+=(g++); fi
# shellcheck disable=SC2086  # CPPFLAGS holds several words
echo '#include <cjson/cJSON.h>' | "$cc" ${CPPFLAGS:-} -E -x c - >/dev/null 2>&1 || apt+=(libcjson-dev)
if ! command -v python3 >/dev/null 2>&1; then
    apt+=(python3 python3-pip)
else
    mods=(numpy)
    [ "$what" = test ] && mods+=(pytest)
    for m in "${mods[@]}"; do python3 -c "import $m" >/dev/null 2>&1 || pip+=("$m"); done
fi
[ ${#apt[@]} -eq 0 ] && [ ${#pip[@]} -eq 0 ] && exit 0
hint="python3 -m pip install -r python/requirements-test.txt"
[ ${#apt[@]} -gt 0 ] && hint="apt-get install ${apt[*]}${pip[*]:+ && $hint}"
echo "kdt: missing $(echo "${apt[*]} ${pip[*]}" | xargs); install with: $hint (README: Requirements)" >&2
exit 1
