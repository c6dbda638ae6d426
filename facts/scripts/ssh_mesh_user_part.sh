
home=$1; key=$2
meta() { if [ -e "$1" ]; then printf '%s %s %s\n' "$2" "$(stat -L -c '%a %U' -- "$1")" "$( [ -f "$1" ] && sha256sum < "$1" | cut -d' ' -f1 || echo -)"; else echo "$2 missing"; fi; }
meta "$home/.ssh" ssh_dir
meta "$home/.ssh/$key" identity
meta "$home/.ssh/$key.pub" identity_pub
tf_file authorized_keys "$home/.ssh/authorized_keys"
tf_file config "$home/.ssh/config"
tf_file certificate "$home/.ssh/$key-cert.pub"
