#!/usr/bin/env bash
# test_nan_lost_drain.sh: test_nan_lost_report.sh with the operator's drain under way when the
# NaN report is lost with its coordinator (see there).
NAN_LOST_DRAIN=1 exec "$(dirname "$0")/test_nan_lost_report.sh"
