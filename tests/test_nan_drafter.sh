#!/usr/bin/env bash
# test_nan_drafter.sh: a NaN loss in one drafter rank (drafter.debug_nan_step) skips that step
# on both ranks, is reported, pauses the cluster (dflashctl status, sd_notify STATUS); a stop in
# that state writes no checkpoint; the drafter restarted without the key rejoins, the group
# restarts from the checkpoint before the NaN, and `dflashctl resume` completes the run with
# every batch trained once. See tests/soak/nan.sh.
exec "$(dirname "$0")/soak/nan.sh" drafter
