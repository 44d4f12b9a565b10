# device-env.sh: on a host that lacks libuv, inih, cJSON, SQLite, libsystemd and OpenBLAS and has no apt,
# unpacks the Debian packages in .devdeps/ and points the compiler and loader at them:
# `. tools/device-env.sh` from the repo root.
D=${DEVDEPS_ROOT:-/tmp/dflash-devdeps}
if [ ! -d "$D/usr" ]; then
  for f in .devdeps/*.deb; do dpkg -x "$f" "$D"; done
fi
L=$D/usr/lib/x86_64-linux-gnu
export CPATH=$D/usr/include:$D/usr/include/x86_64-linux-gnu/openblas-pthread${CPATH:+:$CPATH}
export LIBRARY_PATH=$L:$L/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}
export LD_LIBRARY_PATH=$L:$L/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
