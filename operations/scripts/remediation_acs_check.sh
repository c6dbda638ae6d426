mask=$1 setpci=$2; shift 2
# Each bridge's ACS Control register read back (setpci by the absolute path the fact found:
# four hex digits), the redirect bits ($1, a mask) clear: the unit did what it says. A bridge
# bound to vfio-pci now is left alone, as the unit leaves it.
for b in "$@"; do
  if [ "/sys/bus/pci/devices/$b/driver" -ef /sys/bus/pci/drivers/vfio-pci ]; then
    echo "trainfleet: $b: bound to vfio-pci, left alone"; continue
  fi
  v=$("$setpci" -s "$b" ECAP_ACS+0x6.w 2>/dev/null) || { echo "trainfleet: $b: ACS control unreadable ($setpci)" >&2; exit 1; }
  case $v in ''|*[!0-9a-fA-F]*) echo "trainfleet: $b: setpci read '$v'" >&2; exit 1 ;; esac
  if [ $((0x$v & 0x$mask)) -ne 0 ]; then
    echo "trainfleet: $b: ACS redirects still on (ACS Control 0x$v)" >&2; exit 1
  fi
  echo "trainfleet: $b: ACS redirects off"
done
exit 0
