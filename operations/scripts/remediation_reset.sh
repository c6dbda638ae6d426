
mode=$1 t=$2 gpus=$3 wait=$4; shift 4
# $1 "all" (an NVSwitch system: every GPU in one nvidia-smi -r, the fabric manager stopped) or
# "each" (nvidia-smi -r -i per GPU); $2 seconds nvidia-smi may take; $3 the GPUs, comma-separated;
# $4 seconds the fabric may take to be built again; then the units to stop, in order. Stops at
# the first failure and says where things stand; nothing is undone behind the operator's back.
stopped='' reset='' started=''
say() { echo "trainfleet: $*"; }
fail() {
  echo "trainfleet: $*" >&2
  echo "trainfleet: where things stand: stopped (not started again):${stopped:- none}; GPUs reset:${reset:- none}; started again:${started:- none}" >&2
  exit 1
}
# A job may have started since the fact was read: the GPU processes are listed again right
# before anything is stopped (pids only: no process name is read).
p=$(timeout -k 2 "$t" nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null) ||
  fail "the GPU processes could not be listed: nothing stopped"
p=$(printf '%s\n' "$p" | sed -n 's/^ *\([0-9]\{1,10\}\) *$/\1/p' | tr '\n' ' ')
[ -z "$p" ] || fail "GPU processes running (pids ${p% }): nothing stopped"
for u in "$@"; do
  systemctl is-active --quiet "$u.service" || continue
  timeout 120 systemctl stop "$u.service" || fail "systemctl stop $u failed"
  stopped="$stopped $u"; say "stopped $u"
done
if [ "$mode" = all ]; then
  timeout -k 5 300 nvidia-smi -r || fail "nvidia-smi -r (every GPU) failed"
  reset=' every GPU'; say "reset every GPU"
else
  for g in $(printf '%s' "$gpus" | tr ',' ' '); do
    timeout -k 5 300 nvidia-smi -r -i "$g" || fail "nvidia-smi -r -i $g failed"
    reset="$reset $g"; say "reset GPU $g"
  done
fi
rev=''
for u in $stopped; do rev="$u $rev"; done
for u in $rev; do  # in the reverse order: the fabric manager first, after the last reset
  timeout 120 systemctl start "$u.service" || fail "systemctl start $u failed"
  started="$started $u"; stopped=${stopped% "$u"}; say "started $u"
done
# No GPU may still ask for a reset and, on an NVSwitch system, every GPU's fabric must be
# built again (the fabric manager takes a while). The element lines are only ever searched for
# a failure: none can be hidden by another line, no GPU process runs to print a name, and the
# controller parses the whole document again after this run (deploy/remediate.py).
n=0
while :; do
  x=$(timeout -k 2 "$t" nvidia-smi -q -x 2>/dev/null) || fail "nvidia-smi -q -x failed after the reset"
  bad=$(printf '%s\n' "$x" | grep -E '<(reset_required|remapped_row_pending|pending_retirement)>Yes<|<gpu_recovery_action>' |
    grep -v -E '<gpu_recovery_action>(None|N/A)<' | tr -d ' \t' | tr '\n' ' ')
  [ -z "$bad" ] || fail "a GPU still asks for a reset: $bad"
  [ "$mode" = all ] || break
  f=$(printf '%s\n' "$x" | awk '/<fabric>/ { f = 1 } /<\/fabric>/ { f = 0 } f && /<(state|status)>/ { gsub(/[ \t]/, ""); print }')
  left=$(printf '%s\n' "$f" | grep -v -E '^<state>Completed</state>$|^<status>Success</status>$' | tr '\n' ' ')
  [ -n "$f" ] && [ -z "${left% }" ] && break
  [ "$n" -lt "$wait" ] || fail "the fabric is not built ${wait}s after the reset: ${left:-no fabric state}"
  sleep 5; n=$((n + 5))
done
say "checked: no GPU asks for a reset$([ "$mode" = all ] && echo ', every fabric Completed/Success')"
exit 0
