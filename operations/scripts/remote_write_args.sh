set -eu
fail() { echo "trainfleet: $f: $*; nothing was changed" >&2; exit 1; }
f=$1; want=$2; mode=$3; dmode=$4
cd /
