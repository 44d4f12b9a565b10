#!/usr/bin/env bash
# test_soak_coord_down.sh: coordinator and drafter rank 1 SIGKILLed together, rank 0 having
# checkpointed while the coordinator was down; every batch trained once. See tests/soak/coord_down_kill.sh.
exec "$(dirname "$0")/soak/coord_down_kill.sh"
