
u=/run/trainfleet-upload.$2
if [ ! -e "$u" ] && [ ! -L "$u" ]; then install -d -m 700 -o "$2" -g "$(id -g -- "$2")" "$u" 2>/dev/null || true; fi
if [ -L "$u" ] || [ ! -d "$u" ] || [ "$(stat -c '%U %a' "$u")" != "$2 700" ]; then
  echo "trainfleet: $u must be a directory owned by $2 with mode 700 (remove it and re-run)" >&2; exit 1
fi
