#!/usr/bin/env bash
# Builds the Debian package of ztier with dpkg-deb, from this checkout:
#
#   bash packaging/build-deb.sh [OUT_DIR]     (default target/debian; prints the .deb's path)
#
# What it holds: /usr/bin/ztier; its man pages (`ztier manpages`, gzip'd in man1); the bash,
# zsh and fish completions (`ztier completions`); the systemd units of contrib/systemd in the
# distribution's unit directory (installed, not enabled) and the system user they run as
# (sysusers.d); libztier_uffd (crates/ztier-uffd's cdylib) as libztier_uffd.so.VERSION with
# the SONAME libztier_uffd.so.0, its header and pkg-config file ztier-uffd; the bundled
# sample (/usr/share/ztier/samples, for `ztier bench --corpus`); host.toml as an example; the
# license. The version is the workspace's (Cargo.toml), the dependencies dpkg-shlibdeps's.
#
# dpkg-deb rather than cargo-deb: it is part of dpkg, on every Debian machine, where
# cargo-deb must be compiled first (minutes of CI's two cores), and the man pages and
# completions come from the built binary anyway, a step cargo-deb does not run. Set
# ZTIER_BUILD_LOCK to a lock file to run cargo under flock (a shared build machine).
# Needs: cargo, dpkg-dev (dpkg-shlibdeps, dpkg-architecture), patchelf, pkg-config.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/debian}
target=${CARGO_TARGET_DIR:-target}

cargo_() {
  if [ -n "${ZTIER_BUILD_LOCK:-}" ]; then
    flock "$ZTIER_BUILD_LOCK" cargo "$@"
  else
    cargo "$@"
  fi
}

# The workspace's version: [workspace.package]'s version key.
version=$(awk '/^\[/ { section = $0 } section == "[workspace.package]" && $1 == "version" { gsub(/"/, "", $3); print $3 }' Cargo.toml)
[ -n "$version" ] || { echo "build-deb: no version in Cargo.toml's [workspace.package]" >&2; exit 1; }
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
# Where this release keeps units and sysusers.d files (bookworm: /lib/systemd/system).
unitdir=$(pkg-config --variable=systemdsystemunitdir systemd 2>/dev/null || echo /usr/lib/systemd/system)
sysusersdir=$(pkg-config --variable=sysusersdir systemd 2>/dev/null || echo /usr/lib/sysusers.d)
# The C ABI has no stability promise before 1.0, so its SONAME names the major version 0.
soname=libztier_uffd.so.0

cargo_ build --release --locked -q -p ztier-cli -p ztier-uffd
ztier="$target/release/ztier"
built_version=$("$ztier" --version)
[ "$built_version" = "ztier $version" ] ||
  { echo "build-deb: the binary says '$built_version', Cargo.toml $version" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# debian/ztier: where dpkg-shlibdeps expects a package's files to be.
stage="$work/debian/ztier"
mkdir -p "$stage"
printf 'Source: ztier\n\nPackage: ztier\nArchitecture: any\n' >"$work/debian/control"

# The binary and the library, stripped as dh_strip strips them (the debug info stays in
# target/).
install -Dm755 "$ztier" "$stage/usr/bin/ztier"
strip --remove-section=.comment --remove-section=.note "$stage/usr/bin/ztier"
libdir="$stage/usr/lib/$multiarch"
install -Dm644 "$target/release/libztier_uffd.so" "$libdir/libztier_uffd.so.$version"
strip --remove-section=.comment --remove-section=.note --strip-unneeded "$libdir/libztier_uffd.so.$version"
patchelf --set-soname "$soname" "$libdir/libztier_uffd.so.$version"
ln -s "libztier_uffd.so.$version" "$libdir/$soname"
ln -s "$soname" "$libdir/libztier_uffd.so"
install -Dm644 crates/ztier-uffd/include/ztier_uffd.h "$stage/usr/include/ztier_uffd.h"
mkdir -p "$libdir/pkgconfig"
sed -e "s|@MULTIARCH@|$multiarch|" -e "s|@VERSION@|$version|" packaging/ztier-uffd.pc.in >"$libdir/pkgconfig/ztier-uffd.pc"

# Man pages and completions, from the binary's own definitions.
"$ztier" manpages "$work/man" >/dev/null
mkdir -p "$stage/usr/share/man/man1"
for page in "$work"/man/*.1; do
  name=$(basename "$page")
  gzip -9n <"$page" >"$stage/usr/share/man/man1/$name.gz"
done
install -d "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions" \
  "$stage/usr/share/fish/vendor_completions.d"
"$ztier" completions bash >"$stage/usr/share/bash-completion/completions/ztier"
"$ztier" completions zsh >"$stage/usr/share/zsh/vendor-completions/_ztier"
"$ztier" completions fish >"$stage/usr/share/fish/vendor_completions.d/ztier.fish"

# The units, not enabled (no maintainer script enables them), and their user.
install -Dm644 -t "$stage$unitdir" contrib/systemd/*.service contrib/systemd/*.socket
install -Dm644 packaging/ztier.sysusers "$stage$sysusersdir/ztier.conf"

install -Dm644 -t "$stage/usr/share/ztier/samples" samples/sample.pages.zst samples/sample.truth.json
install -Dm644 contrib/systemd/host.toml "$stage/usr/share/doc/ztier/examples/host.toml"
install -Dm644 packaging/copyright "$stage/usr/share/doc/ztier/copyright"

# The control files (DEBIAN/ first: it marks the package's root for dpkg-shlibdeps).
install -d -m755 "$stage/DEBIAN"
installed_size=$(du -sk --apparent-size --exclude=DEBIAN "$stage" | cut -f1)
depends=$(cd "$work" && dpkg-shlibdeps -O -edebian/ztier/usr/bin/ztier \
  "-edebian/ztier/usr/lib/$multiarch/libztier_uffd.so.$version" |
  sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "build-deb: dpkg-shlibdeps found no dependencies" >&2; exit 1; }
sed -e "s|@VERSION@|$version|" -e "s|@ARCH@|$arch|" -e "s|@INSTALLED_SIZE@|$installed_size|" \
  -e "s|@DEPENDS@|$depends|" packaging/control.in >"$stage/DEBIAN/control"
install -m755 packaging/postinst packaging/postrm "$stage/DEBIAN/"
install -m644 packaging/triggers "$stage/DEBIAN/triggers"
# For packages linking the library (their dpkg-shlibdeps reads it).
echo "libztier_uffd 0 ztier (>= $version)" >"$stage/DEBIAN/shlibs"
chmod 644 "$stage/DEBIAN/shlibs"
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
  xargs -0 md5sum >DEBIAN/md5sums)
chmod 644 "$stage/DEBIAN/md5sums"

mkdir -p "$out"
deb="$out/ztier_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "$deb"
