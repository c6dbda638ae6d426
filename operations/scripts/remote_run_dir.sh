
r=$1
if [ ! -e "$r" ] && [ ! -L "$r" ]; then mkdir -m 700 "$r" 2>/dev/null || true; fi
if [ -L "$r" ] || [ ! -d "$r" ] || [ "$(stat -c '%u %a' "$r")" != "0 700" ]; then
  echo "trainfleet: $r must be a directory owned by root with mode 700 (remove it and re-run)" >&2; exit 1
fi
