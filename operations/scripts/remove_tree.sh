set -eu
# $1 a directory of trainfleet's, $2 its parent (removed when empty), then the names below $1
# to remove (files, or with -r: the whole directory $1). Root's own directories only.
fail() { echo "trainfleet: $d: $*; nothing was changed" >&2; exit 1; }
d=$1; parent=$2; shift 2
cd /
[ ! -L "$d" ] || fail "is a symbolic link: nothing removed through it"
[ -d "$d" ] || exit 0
root_safe_dir "$d"
if [ "${1:-}" = -r ]; then
  rm -rf -- "$d"
else
  [ ! -L "$d/healthy" ] || fail "healthy is a symbolic link: nothing removed through it"
  for n in "$@"; do rm -f -- "$d/$n"; done
  [ ! -d "$d/healthy" ] || rmdir -- "$d/healthy" 2>/dev/null || true
  rmdir -- "$d" 2>/dev/null || true
fi
rmdir -- "$parent" 2>/dev/null || true
