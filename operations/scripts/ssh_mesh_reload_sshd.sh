
krl=$1 drop_in=$2 client=${3:-}
sshd=$(command -v sshd || echo /usr/sbin/sshd)
reload() {
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet ssh 2>/dev/null; then systemctl reload ssh
  elif command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet sshd 2>/dev/null; then systemctl reload sshd
  elif [ -s /run/sshd.pid ] && kill -0 "$(cat /run/sshd.pid)" 2>/dev/null; then kill -HUP "$(cat /run/sshd.pid)"
  else echo "sshd's service (ssh, sshd) or /run/sshd.pid could not be found to reload it" >&2; return 1
  fi
}
if [ -f "$krl" ]; then
  for pub in /etc/ssh/ssh_host_*_key.pub; do
    ssh-keygen -Q -f "$krl" "$pub" >/dev/null 2>&1; rc=$?
    if [ $rc -gt 1 ]; then
      # ssh refuses every host while its RevokedHostKeys file does not read: its drop-in goes too.
      [ -n "$client" ] && [ -f "$client" ] && mv -f -- "$client" "$client.rejected"
      [ -f "$drop_in" ] && mv -f -- "$drop_in" "$drop_in.rejected" && "$sshd" -t >/dev/null 2>&1 && reload
      echo "$krl does not read as a key revocation list: $drop_in moved to $drop_in.rejected" >&2; exit 1
    fi
    break
  done
fi
if ! out=$("$sshd" -t 2>&1); then
  if [ -f "$drop_in" ]; then
    mv -f -- "$drop_in" "$drop_in.rejected"
    if ! "$sshd" -t >/dev/null 2>&1; then
      mv -f -- "$drop_in.rejected" "$drop_in"
      echo "sshd -t refuses sshd's own configuration, with or without trainfleet's drop-in ($out): sshd not reloaded" >&2
      exit 1
    fi
  fi
  echo "sshd -t refused trainfleet's drop-in ($out): moved to $drop_in.rejected, sshd not reloaded" >&2; exit 1
fi
reload
