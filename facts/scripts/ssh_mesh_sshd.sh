
main=$1 drop_in=$2 krl=$3 client=$4 client_drop_in=$5; shift 5
if grep -Eiq '^[[:space:]]*Include[[:space:]]+/etc/ssh/sshd_config\.d/\*\.conf([[:space:]]|$)' "$main" 2>/dev/null
then echo "include yes"; else echo "include no"; fi
for f in "$main" /etc/ssh/sshd_config.d/*.conf; do
  [ "$f" = "$drop_in" ] || ! [ -f "$f" ] && continue
  grep -Eiq '^[[:space:]]*RevokedKeys[[:space:]]' "$f" && echo "revoked_keys_in $f"
done
if [ -f "$client" ] && awk '
  { line = tolower($0); sub(/^[ \t]+/, "", line); sub(/[ \t]+$/, "", line) }
  line ~ /^host[ \t=]/ { scoped = line !~ /^host[ \t=]+\*$/; next }
  line ~ /^match[ \t=]/ { scoped = line !~ /^match[ \t=]+all$/; next }
  !scoped && line ~ /^include[ \t=]+(\/etc\/ssh\/)?ssh_config\.d\/\*\.conf([ \t]|$)/ { found = 1 }
  END { exit !found }' "$client"
then echo "client_include yes"; else echo "client_include no"; fi
for f in "$client" /etc/ssh/ssh_config.d/*.conf; do
  [ "$f" = "$client_drop_in" ] || ! [ -f "$f" ] && continue
  grep -Eiq '^[[:space:]]*RevokedHostKeys([[:space:]]|=)' "$f" && echo "revoked_host_keys_in $f"
done
tf_file drop_in "$drop_in"
tf_file krl "$krl"
tf_file client_drop_in "$client_drop_in"
for f in "$@"; do tf_file "$f" "$f"; done
true
