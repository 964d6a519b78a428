# Sourced by scripts/setup.sh and scripts/setup_arm64.sh: apt_install_missing WHO PACKAGE...
# installs the Debian packages among PACKAGE... that are not installed yet (apt-get update first,
# non-interactive, no recommends; through sudo when not root), saying which as WHO.
apt_install_missing() {
  local who=$1 p sudo=""
  shift
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "$who: installing ${missing[*]}" >&2
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}
