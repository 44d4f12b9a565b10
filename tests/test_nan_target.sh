#!/usr/bin/env bash
# test_nan_target.sh: NaN in a target's captured states (target.debug_nan_batch) is detected in
# the step that trains it, reported, pauses the cluster (dflashctl status, sd_notify STATUS), no
# checkpoint is written from it, and after the target is restarted without the key `dflashctl
# resume` completes the run with every batch trained once. See tests/soak/nan.sh.
exec "$(dirname "$0")/soak/nan.sh" target
