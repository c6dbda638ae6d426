
mode=$1 t=$2 gpus=$3 wait=$4; shift 4
# $1 "all" (an NVSwitch system: every GPU in one nvidia-smi -r, the fabric manager stopped) or
# "each" (nvidia-smi -r -i per GPU); $2 seconds nvidia-smi may take; $3 the GPUs, comma-separated;
# $4 seconds the fabric may take to be built again; then the units to stop, in order. Stops at
# the first failure and says where things stand. Before any GPU is reset, a failure starts what
# was stopped again (in reverse) first; once one is reset, nothing is undone behind the
# operator's back. A hangup or TERM says where things stand too.
stopped='' reset='' started='' doing=''
say() { echo "trainfleet: $*"; }
fail() {
  trap - HUP TERM
  echo "trainfleet: $*" >&2
  echo "trainfleet: where things stand: stopped (not started again):${stopped:- none}; GPUs reset:${reset:- none}; started again:${started:- none}" >&2
  exit 1
}
trap 'fail "interrupted by SIGHUP${doing:+ during $doing}"' HUP
trap 'fail "interrupted by SIGTERM${doing:+ during $doing}"' TERM
# The GPU processes' pids in $p, space-separated; fails where they cannot all be read
# (gpu_pids, facts/scripts/gpu_pids.sh: what cannot be read is not "no job").
listed() { o=$(gpu_pids "$t") || return 1; p=$(printf '%s' "$o" | tr '\n' ' '); }
# The stopped units started again, in the reverse order (the fabric manager first).
start_again() {
  rev=''
  for u in $stopped; do rev="$u $rev"; done
  for u in $rev; do
    doing="systemctl start $u"
    timeout 120 systemctl start "$u.service" || fail "systemctl start $u failed"
    started="$started $u"; stopped=${stopped% "$u"}; doing=''; say "started $u"
  done
}
# No GPU reset yet: what was stopped is started again, then the failure.
undo() {
  echo "trainfleet: $1; no GPU was reset: starting again what was stopped" >&2
  start_again
  fail "$1"
}
# A job may have started since the fact was read: the GPU processes are listed again right
# before anything is stopped.
listed || fail "the GPU processes could not be listed: nothing stopped"
[ -z "$p" ] || fail "GPU processes running (pids ${p% }): nothing stopped"
for u in "$@"; do
  systemctl is-active --quiet "$u.service" || continue
  doing="systemctl stop $u"
  timeout 120 systemctl stop "$u.service" || undo "systemctl stop $u failed"
  stopped="$stopped $u"; doing=''; say "stopped $u"
done
# ... and again once the services are stopped (that can take minutes), right before the reset.
listed || undo "the GPU processes could not be listed after the stops"
[ -z "$p" ] || undo "GPU processes running (pids ${p% }) after the stops"
if [ "$mode" = all ]; then
  doing="nvidia-smi -r"
  timeout -k 5 300 nvidia-smi -r || undo "nvidia-smi -r (every GPU) failed"
  reset=' every GPU'; doing=''; say "reset every GPU"
else
  for g in $(printf '%s' "$gpus" | tr ',' ' '); do
    doing="nvidia-smi -r -i $g"
    if ! timeout -k 5 300 nvidia-smi -r -i "$g"; then
      [ -n "$reset" ] || undo "nvidia-smi -r -i $g failed"
      fail "nvidia-smi -r -i $g failed"
    fi
    reset="$reset $g"; doing=''; say "reset GPU $g"
  done
fi
start_again  # after the last reset
# No GPU may still ask for a reset and, on an NVSwitch system, every GPU's fabric must be
# built again (the fabric manager takes a while). The element lines are only ever searched for
# a failure: none can be hidden by another line, no GPU process runs to print a name, and the
# controller parses the whole document again after this run (deploy/remediate.py).
n=0
while :; do
  doing="the checks after the reset"
  x=$(timeout -k 2 "$t" nvidia-smi -q -x 2>/dev/null) || fail "nvidia-smi -q -x failed after the reset"
  # -a: a process name's bytes that are not UTF-8 (nvidia-smi prints them as they are) must not
  # make grep call the document binary and keep its lines back
  bad=$(printf '%s\n' "$x" | grep -a -E '<(reset_required|remapped_row_pending|pending_retirement)>Yes<|<gpu_recovery_action>' |
    grep -a -v -E '<gpu_recovery_action>(None|N/A)<' | tr -d ' \t' | tr '\n' ' ')
  [ -z "$bad" ] || fail "a GPU still asks for a reset: $bad"
  [ "$mode" = all ] || break
  f=$(printf '%s\n' "$x" | awk '/<fabric>/ { f = 1 } /<\/fabric>/ { f = 0 } f && /<(state|status)>/ { gsub(/[ \t]/, ""); print }')
  left=$(printf '%s\n' "$f" | grep -v -E '^<state>Completed</state>$|^<status>Success</status>$' | tr '\n' ' ')
  [ -n "$f" ] && [ -z "${left% }" ] && break
  [ "$n" -lt "$wait" ] || fail "the fabric is not built ${wait}s after the reset: ${left:-no fabric state}"
  sleep 5; n=$((n + 5))
done
trap - HUP TERM
say "checked: no GPU asks for a reset$([ "$mode" = all ] && echo ', every fabric Completed/Success')"
exit 0
