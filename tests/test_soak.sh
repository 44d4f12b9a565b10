#!/usr/bin/env bash
# test_soak.sh: the short kill-everything soak (tests/soak/soak.sh --short): coordinator, targets
# and drafters SIGKILLed at random points of a 2-epoch run and started again; the run completes
# with every batch trained exactly once in the surviving lineage, no leaked slot, nothing left in
# /dev/shm, no socket left. The seed is random per run and printed (replay: --seed N).
exec "$(dirname "$0")/soak/soak.sh" --short "$@"
