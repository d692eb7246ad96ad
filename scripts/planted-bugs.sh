#!/usr/bin/env bash
# Shows the simulation can fail: plants each bug in tests/simulation/planted/*.patch
# in turn, runs the simulation (SIM_SCHEDULES, default its CI budget), expects it to
# fail, and reverts the patch. Prints how many schedules each plant took to catch.
# Run from a clean worktree: each patch is applied to src/ and reverted.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
for patch in tests/simulation/planted/*.patch; do
    git apply "$patch" || { echo "$patch: does not apply"; status=1; continue; }
    out=$(cargo test --test integration simulation::simulation -- --exact 2>&1)
    result=$?
    git apply -R "$patch"
    if [ "$result" -eq 0 ]; then
        echo "$patch: NOT caught"
        status=1
    else
        caught=$(grep -o 'simulation failed with seed [0-9]* (after [0-9]* schedules' <<<"$out" | head -1)
        echo "$patch: caught: ${caught:-the test failed without a seed (build error?)}"
        grep -m1 -A1 '^simulation failed' <<<"$out" | tail -1
        [ -n "$caught" ] || status=1
    fi
done
exit "$status"
