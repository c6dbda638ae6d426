set -eu
fail() { echo "trainfleet: $f: $*; nothing was changed" >&2; exit 1; }
f=$1; want=$2
cd /
[ ! -L "$f" ] || fail "is a symbolic link: not removed"
[ -e "$f" ] || exit 0
[ -f "$f" ] || fail "is not a regular file: not removed"
d=${f%/*}; [ -n "$d" ] || d=/
[ "$(id -u)" != 0 ] || root_safe_dir "$d"
case $want in
  any) ;;
  *) [ "$(sha256sum < "$f" | cut -d' ' -f1)" = "$want" ] || fail "changed after it was read (run again)" ;;
esac
rm -f -- "$f"
