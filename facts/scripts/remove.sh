
# $1 the launcher directory, $2 the venv, $3 the ACS unit's name; then every root-owned file
# trainfleet writes whole or holds a block in (each one framed ``file`` line).
launch=$1 venv=$2 unit=$3; shift 3
for f in "$@"; do tf_file "$f" "$f"; done
if [ -L "$launch" ]; then echo "launch link"
elif [ -d "$launch" ]; then
  # root's own directory: each entry's type and path below it, NUL-separated, as one base64 line
  printf 'launch '; find "$launch" -mindepth 1 -maxdepth 2 -printf '%y %P\0' | base64 -w0; echo
else echo "launch missing"; fi
if [ -L "$venv" ]; then echo "venv link"; elif [ -d "$venv" ]; then echo "venv yes"; else echo "venv missing"; fi
if command -v systemctl >/dev/null 2>&1; then echo "unit $(systemctl is-enabled "$unit.service" 2>/dev/null || true)"; fi
if command -v dpkg-query >/dev/null 2>&1; then
  dpkg-query -W -f='${Status} ${Package}\n' 2>/dev/null | awk '$1 == "hold" { print "hold " $4 }'
fi
for f in /etc/dnf/plugins/versionlock.list /etc/yum/pluginconf.d/versionlock.list; do
  [ -r "$f" ] && awk '/^[^#! ]/ { print "lock " $0 }' "$f"
done
true
