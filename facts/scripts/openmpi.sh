
file=$1 part=$2; shift 2
echo "version $(mpirun --version 2>/dev/null | head -n 1)"
for u in "$@"; do
  entry=$(getent passwd "$u") || { echo "user $u nouser"; continue; }
  home=$(echo "$entry" | cut -d: -f6); uid=$(echo "$entry" | cut -d: -f3); gid=$(echo "$entry" | cut -d: -f4)
  printf 'user %s %s %s %s ' "$u" "$uid" "$(getent group "$gid" | cut -d: -f1 | tr -d ' ')" "$(printf %s "$home" | base64 -w0)"
  tf_as "$uid" "$gid" "$part" "$home/$file"
done
