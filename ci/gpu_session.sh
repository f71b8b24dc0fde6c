#!/usr/bin/env bash
# A GPU window's whole work as one background job, so that the lent machine never idles between calls (it is given
# back after 30 s idle) and nothing waits on a person. On the device machine, from the checkout's root:
#   ci/gpu_session.sh start [NAME ...]     run the steps of ci/gpu_session.steps (or only those named) in order under
#                                          setsid, each into $SESSION/NAME.log with a marker NAME.ok or NAME.fail;
#                                          returns at once
#   ci/gpu_session.sh wait SECONDS [NAME]  wait until step NAME ends (default: the one running now), a step fails or
#                                          SECONDS pass; pack the logs and results into $OUT/session.tgz (a call
#                                          brings back only a few files); print where the run stands. Exits 3 at once
#                                          where there is no run: a fresh machine, whose build is gone
#   ci/gpu_session.sh stop                 end the run (the step running now included): its process group, not a
#                                          pattern, which would match the call's own command line and kill it
# On the machine that sends the calls, before the first: ci/gpu_session.sh carry, which fills .whl with what the
# device machine cannot download (wheels of $DEVICE_WHEELS for its Python) and fetches the sdist into vendor/.cache;
# the calls then carry [".whl", "vendor/.cache"].
# A step is a line "NAME: COMMAND" (bash) of the steps file; the steps after a failed one still run, except after
# `build`. $SESSION (/tmp/gpu-session) holds the logs; results go to $SESSION/out, which the steps see as
# $PYLLAMA_MOE_BENCH_OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
SESSION=${SESSION:-/tmp/gpu-session}
STEPS=${PYLLAMA_MOE_SESSION_STEPS:-ci/gpu_session.steps}
PY=${PYTHON:-python3}
# the build (scikit-build-core, cffi), the synthetic models (gguf) and the load test's server
DEVICE_WHEELS="cffi pycparser gguf scikit-build-core fastapi uvicorn pydantic-settings"

carry() {  # here, with network: wheels for the device machine's Python (3.12), which has numpy, pytest, PyYAML, tqdm
    local py=${PYLLAMA_MOE_DEVICE_PYTHON:-3.12}
    rm -rf .whl
    "$PY" -m pip download --disable-pip-version-check -q --only-binary=:all: --python-version "$py" \
        --platform manylinux2014_x86_64 -d .whl $DEVICE_WHEELS
    rm -f .whl/numpy-* .whl/PyYAML-* .whl/pyyaml-* .whl/tqdm-*  # there already; the carry holds 64 MiB in all
    "$PY" scripts/vendor.py fetch
    du -sh .whl vendor/.cache
}

run_steps() {  # the background job: every step in order, a marker each
    local wanted=("$@") line name cmd start rc
    mkdir -p "$SESSION/out"
    export PYLLAMA_MOE_BENCH_OUT="$SESSION/out"
    # shellcheck disable=SC2086  # a list of names
    "$PY" -m pip install --disable-pip-version-check -q --no-index --find-links .whl $DEVICE_WHEELS
    while IFS= read -r line; do
        [[ -z "$line" || "$line" == \#* ]] && continue
        name=${line%%:*}
        cmd=${line#*: }
        if [ ${#wanted[@]} -gt 0 ] && [[ " ${wanted[*]} " != *" $name "* ]]; then
            continue
        fi
        echo "$name" > "$SESSION/current"
        start=$(date +%s)
        bash -c "$cmd" > "$SESSION/$name.log" 2>&1
        rc=$?
        echo "$name: exit $rc after $(( $(date +%s) - start )) s" >> "$SESSION/summary"
        if [ $rc -eq 0 ]; then
            touch "$SESSION/$name.ok"
        else
            touch "$SESSION/$name.fail"
            # the others need the build; the build's own failure ends the run
            [ "$name" = build ] && break
        fi
        # the build is done once: the later steps install nothing
        [ "$name" = build ] && export PYLLAMA_MOE_NO_BUILD=1
    done < "$STEPS"
    echo done > "$SESSION/current"
    touch "$SESSION/done"
}

start() {
    rm -rf "$SESSION" && mkdir -p "$SESSION"
    setsid nohup bash "$0" _run "$@" > "$SESSION/runner.log" 2>&1 < /dev/null &
    echo $! > "$SESSION/pgid"  # setsid made the runner the leader of its own group
    echo "gpu_session.sh: started ($(grep -cv -e '^#' -e '^$' "$STEPS") steps in $STEPS)"
}

report() {  # the logs and results to $OUT, and where the run stands
    if [ -n "${OUT:-}" ]; then
        tar czf "$OUT/session.tgz" -C "$SESSION" . 2>/dev/null || true
    fi
    echo "--- summary"
    cat "$SESSION/summary" 2>/dev/null
    local cur
    cur=$(cat "$SESSION/current" 2>/dev/null || echo none)
    echo "--- now: $cur"
    [ -f "$SESSION/$cur.log" ] && tail -n 15 "$SESSION/$cur.log"
    return 0
}

wait_for() {  # wait_for SECONDS [NAME]
    local limit=$1 name=${2:-} deadline failed
    if [ ! -f "$SESSION/pgid" ]; then
        echo "gpu_session.sh: no run on this machine ($SESSION/pgid is missing): a fresh machine, start again" >&2
        exit 3
    fi
    [ -z "$name" ] && name=$(cat "$SESSION/current" 2>/dev/null || echo done)
    failed=$(ls "$SESSION"/*.fail 2>/dev/null | wc -l)
    deadline=$(( $(date +%s) + limit ))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        [ -f "$SESSION/$name.ok" ] || [ -f "$SESSION/$name.fail" ] || [ -f "$SESSION/done" ] && break
        [ "$(ls "$SESSION"/*.fail 2>/dev/null | wc -l)" -gt "$failed" ] && break
        sleep 2
    done
    report
}

case "${1:-}" in
    carry) carry ;;
    start) shift; start "$@" ;;
    _run)  shift; run_steps "$@" ;;
    wait)  shift; wait_for "$@" ;;
    stop)  [ -f "$SESSION/pgid" ] && kill -- "-$(cat "$SESSION/pgid")" 2>/dev/null; echo stopped ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
esac
