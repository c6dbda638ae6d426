
u=$1; key=$2; part=$3
entry=$(getent passwd "$u") || { echo "nouser"; exit 0; }
home=$(echo "$entry" | cut -d: -f6); uid=$(echo "$entry" | cut -d: -f3); gid=$(echo "$entry" | cut -d: -f4)
echo "home $home"; echo "uid $uid"; echo "group $(getent group "$gid" | cut -d: -f1)"
printf 'user '; tf_as "$uid" "$gid" "$part" "$home" "$key"
