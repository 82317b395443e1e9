# Sourced by scripts/gpu_*.sh from the repository root, after they set MAKEVARS. The GPU machine has
# no network: Debian's libcjson, PCRE2 and libmicrohttpd travel there as .deb files in .deb/
# (docs/DEVELOPING.md) and are unpacked here when any of them is missing; their include and library
# paths go into MAKEVARS and LD_LIBRARY_PATH.
if { ! ldconfig -p | grep -q libcjson || [ ! -e /usr/include/pcre2.h ] || ! ldconfig -p | grep -q libmicrohttpd; } &&
    [ -d .deb ]; then
    for f in .deb/*.deb; do dpkg -x "$f" /tmp/kdt-deps; done
    kdt_deps_lib=/tmp/kdt-deps/usr/lib/x86_64-linux-gnu
    MAKEVARS+=(CPPFLAGS=-I/tmp/kdt-deps/usr/include LDFLAGS="-L$kdt_deps_lib -Wl,-rpath,$kdt_deps_lib")
    export LD_LIBRARY_PATH="$kdt_deps_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
