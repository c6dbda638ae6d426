set -eu
url=$1 want=$2 proto=$3
fail() { echo "trainfleet: cuda keyring: $*; nothing installed" >&2; exit 1; }
d=$(mktemp -d) || fail "cannot make a temp directory"
trap 'rm -rf "$d"' EXIT
deb=$d/cuda-keyring.deb
if [ "$proto" = file ]; then
  cp -- "${url#file://}" "$deb" || fail "cannot read $url"
elif command -v curl >/dev/null 2>&1; then
  curl -fsSL --proto "=$proto" --proto-redir "=$proto" -o "$deb" "$url" || fail "cannot download $url"
else
  wget -q -O "$deb" "$url" || fail "cannot download $url"
fi
dpkg-deb -x "$deb" "$d/x" 2>/dev/null || fail "$url is not a .deb"
key=$d/x/usr/share/keyrings/cuda-archive-keyring.gpg
{ [ -f "$key" ] && [ ! -L "$key" ]; } || fail "$url has no /usr/share/keyrings/cuda-archive-keyring.gpg"
if command -v gpg >/dev/null 2>&1; then
  mkdir -m 700 "$d/gnupg"
  got=$(gpg --homedir "$d/gnupg" --batch --no-options --with-colons --import-options show-only \
        --import "$key" 2>/dev/null | awk -F: '$1 == "pub" {p = 1} $1 == "fpr" && p {print $10; p = 0}')
  gpgconf --homedir "$d/gnupg" --kill all >/dev/null 2>&1 || true
elif command -v sq >/dev/null 2>&1; then
  got=$(sq inspect "$key" 2>/dev/null | sed -n 's/^ *Fingerprint: *//p' | tr -d ' ' | tr a-f A-F)
else
  fail "neither gpg nor sq is installed to check its key (apt-get install gpg)"
fi
[ "$got" = "$want" ] || fail "$url holds the key(s) [$(echo $got)], not exactly $want"
DEBIAN_FRONTEND=noninteractive dpkg -i --force-confold "$deb"
