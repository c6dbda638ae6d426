
exec 9>>"$r/lock"
if ! flock -w "$TF_LOCK_WAIT" 9; then
  echo "trainfleet: another trainfleet run holds this node's lock: $(cat "$r/holder" 2>/dev/null || echo unknown); gave up after $TF_LOCK_WAIT s" >&2
  exit 1
fi
c=${SSH_CLIENT:-local}
printf 'controller %s, since %s\n' "${c%% *}" "$(date '+%Y-%m-%dT%H:%M:%S%z')" > "$r/holder"
shift
if [ -n "$TF_STAGED" ]; then exec 0<"$TF_STAGED"; rm -f -- "$TF_STAGED"; fi
if [ -n "$TF_AS" ]; then
  command -v setpriv >/dev/null 2>&1 || { echo "trainfleet: setpriv (util-linux) is needed to write as $TF_AS" >&2; exit 1; }
  as_user() {
    tf_user_env "$TF_AS" timeout "$TF_USER_TIMEOUT" setpriv --reuid="$TF_AS" --regid="$(id -g -- "$TF_AS")" \
      --init-groups sh -c "$TF_SCRIPT" trainfleet "$@" 9>&-
  }
  # The user's process gets no variable of root's: inline content comes on its stdin.
  if [ -n "${TF_DATA:-}" ]; then printf '%s' "$TF_DATA" | as_user "$@"; else as_user "$@"; fi
else
  sh -c "$TF_SCRIPT" trainfleet "$@" 9>&-
fi
