
mask=$1; shift
# Each bridge's ACS Control register read back (setpci: four hex digits), the redirect bits
# ($1, a mask) clear: the unit did what it says.
for b in "$@"; do
  v=$(setpci -s "$b" ECAP_ACS+0x6.w 2>/dev/null) || { echo "trainfleet: $b: ACS control unreadable (setpci)" >&2; exit 1; }
  case $v in ''|*[!0-9a-fA-F]*) echo "trainfleet: $b: setpci read '$v'" >&2; exit 1 ;; esac
  if [ $((0x$v & 0x$mask)) -ne 0 ]; then
    echo "trainfleet: $b: ACS redirects still on (ACS Control 0x$v)" >&2; exit 1
  fi
  echo "trainfleet: $b: ACS redirects off"
done
exit 0
