#!/bin/sh
# Install (or uninstall) spotguard as a systemd service. Run `install.sh --help` for the details.
set -eu

usage() {
	cat <<'EOF'
Usage: systemd/install.sh [--binary PATH]
       systemd/install.sh --uninstall

Installs spotguard as a systemd service under $DESTDIR (default: empty, the running system):

  $DESTDIR/usr/local/bin/spotguard                     the binary (--binary PATH, default bin/spotguard
                                                       from `make build`)
  $DESTDIR/etc/systemd/system/spotguard.service        the agent
  $DESTDIR/etc/systemd/system/spotguard-restore.service  restores the newest checkpoint before the
                                                       trainer starts (pulled in by the trainer's unit)
  $DESTDIR/etc/spotguard/spotguard.yaml                the commented default configuration, only if
                                                       there is none; an edited one is never replaced

  $DESTDIR/etc/systemd/system/spotguard-restore.service.d/10-spotguard-mounts.conf
                                                       RequiresMountsFor= the restore's destination
                                                       (RESTORE_TO from /etc/default/spotguard-restore,
                                                       else checkpoint.dir), so the restore waits for
                                                       the disk it belongs on; only while one is set,
                                                       so run install.sh again after changing them

The checksum of the installed default configuration is kept in
/etc/spotguard/.spotguard.yaml.default.sha256, so that a later install may replace an unedited
default and --uninstall removes the configuration only if it was not edited.

With DESTDIR empty and systemd running, it then runs `systemctl daemon-reload` and, once
/etc/spotguard/spotguard.yaml sets anything (`spotguard config --configured`),
`systemctl enable spotguard.service`. It never starts the service, and leaves it disabled while
the configuration is the untouched default, which does not say how to find the trainer: edit it,
check it with `spotguard config`, then `systemctl enable --now spotguard` (or run install.sh
again). A service that is already running is restarted when its binary or unit changed. With
DESTDIR set, systemctl is not run.

Running it again changes nothing and says so.

  --binary PATH   the spotguard binary to install
  --uninstall     stop and disable the service (when systemd runs), remove what install put
                  there; an edited configuration is left in place
  -h, --help      this help
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
binary="$here/../bin/spotguard"
mode=install
while [ $# -gt 0 ]; do
	case $1 in
	--binary)
		[ $# -ge 2 ] || { echo "install.sh: --binary needs a PATH" >&2; exit 2; }
		binary=$2
		shift 2
		;;
	--binary=*)
		binary=${1#--binary=}
		shift
		;;
	--uninstall)
		mode=uninstall
		shift
		;;
	-h | --help)
		usage
		exit 0
		;;
	*)
		echo "install.sh: unknown argument: $1" >&2
		usage >&2
		exit 2
		;;
	esac
done

DESTDIR=${DESTDIR:-}
DESTDIR=${DESTDIR%/}
bindir=$DESTDIR/usr/local/bin
unitdir=$DESTDIR/etc/systemd/system
confdir=$DESTDIR/etc/spotguard
conf=$confdir/spotguard.yaml
sumfile=$confdir/.spotguard.yaml.default.sha256
units="spotguard.service spotguard-restore.service"
mounts_dropin=$unitdir/spotguard-restore.service.d/10-spotguard-mounts.conf

changed=0 # something was written or removed
restart=0 # the binary or a unit changed

say() { printf '%s\n' "$*"; }

# systemd_running: systemctl is used only on the running system, under systemd.
systemd_running() {
	[ -z "$DESTDIR" ] && [ -d /run/systemd/system ]
}

sha256() {
	sha256sum "$1" | cut -d ' ' -f 1
}

# put SRC DST MODE: copy SRC to DST with MODE unless DST already has the same content and mode.
# The copy goes through a temporary file and a rename, so a running binary is never written into.
put() {
	if [ -f "$2" ] && cmp -s "$1" "$2" && [ "$(stat -c %a "$2")" = "$3" ]; then
		say "unchanged  $2"
		return 1
	fi
	verb=installed
	[ -e "$2" ] && verb="updated  "
	mkdir -p "$(dirname "$2")"
	install -m "$3" "$1" "$2.tmp.$$"
	mv -f "$2.tmp.$$" "$2"
	say "$verb  $2"
	changed=1
	return 0
}

# remove FILE: remove FILE if it is there.
remove() {
	if [ -e "$1" ] || [ -L "$1" ]; then
		rm -f "$1"
		say "removed    $1"
		changed=1
	fi
}

# restore_dest prints where spotguard-restore.service restores to: RESTORE_TO from
# /etc/default/spotguard-restore, else checkpoint.dir as the installed binary reads the installed
# configuration (the environment of this script left out); nothing when neither is set. It fails
# when it cannot tell (the configuration does not load, the binary does not run here).
restore_dest() {
	envfile=$DESTDIR/etc/default/spotguard-restore
	d=
	if [ -f "$envfile" ]; then
		d=$(sed -n 's/^[[:space:]]*RESTORE_TO=[[:space:]]*//p' "$envfile" | tail -n 1)
		d=${d%\"}
		d=${d#\"}
		d=${d%\'}
		d=${d#\'}
	fi
	if [ -z "$d" ] && [ -f "$conf" ]; then
		d=$(env -i PATH=/usr/bin:/bin "$bindir/spotguard" config --config "$conf" --get checkpoint.dir 2>/dev/null) || return 1
	fi
	printf '%s' "$d"
}

# is_configured: whether the installed configuration sets anything yet (`spotguard config
# --configured`, the unit's ExecCondition=), as the installed binary reads it, the environment of
# this script left out. A configuration that does not load counts as set: `spotguard run` says why.
is_configured() {
	env -i PATH=/usr/bin:/bin "$bindir/spotguard" config --configured --config "$conf" >/dev/null 2>&1
}

# install_mounts writes (or removes) the drop-in that orders the restore after the mount of its
# destination. systemd expands % specifiers in RequiresMountsFor=, so % is written as %%.
install_mounts() {
	if ! dest=$(restore_dest); then
		say "skipped    $mounts_dropin: \`spotguard config --get checkpoint.dir\` failed (check $conf"
		say "           with \`spotguard config\`); left as it was"
		return 1
	fi
	if [ -z "$dest" ]; then
		if [ -f "$mounts_dropin" ]; then
			remove "$mounts_dropin"
			rmdir "$(dirname "$mounts_dropin")" 2>/dev/null || true
			return 0
		fi
		return 1
	fi
	case $dest in
	/*) ;;
	*)
		say "skipped    $mounts_dropin: the restore's destination \"$dest\" is not an absolute path"
		say_stale_dropin
		return 1
		;;
	esac
	case $dest in
	*[[:space:]\"\'\\]*)
		say "skipped    $mounts_dropin: the restore's destination \"$dest\" has white space, quotes or"
		say "           backslashes; order spotguard-restore.service after its mount yourself (systemctl edit)"
		say_stale_dropin
		return 1
		;;
	esac
	tmp=$(mktemp)
	{
		printf '%s\n' "# Written by spotguard's install.sh: the restore waits for the disk its destination is on"
		printf '%s\n' "# (RESTORE_TO, else checkpoint.dir). Run install.sh again after changing either."
		printf '%s\n' "[Unit]"
		printf 'RequiresMountsFor=%s\n' "$(printf '%s' "$dest" | sed 's/%/%%/g')"
	} >"$tmp"
	rc=1
	if put "$tmp" "$mounts_dropin" 644; then rc=0; fi
	rm -f "$tmp"
	return $rc
}

# say_stale_dropin says that the mounts drop-in written before, if any, is left as it was: it
# names the destination of before, not the one skipped (found from outside: it was left silently,
# and the run ended "nothing to do").
say_stale_dropin() {
	if [ -f "$mounts_dropin" ]; then
		say "           left as it was: the drop-in there still says $(grep '^RequiresMountsFor=' "$mounts_dropin" | tail -n 1)"
	fi
}

install_config() {
	shipped=$here/spotguard.yaml
	want=$(sha256 "$shipped")
	if [ -f "$conf" ]; then
		have=$(sha256 "$conf")
		recorded=
		[ -f "$sumfile" ] && recorded=$(cut -d ' ' -f 1 "$sumfile")
		if [ "$have" = "$want" ]; then
			say "unchanged  $conf"
		elif [ -n "$recorded" ] && [ "$have" = "$recorded" ]; then
			# The unedited default of an earlier version: replace it with this one.
			put "$shipped" "$conf" 644 || true
		else
			say "kept       $conf: it was edited, so it is left as it is (the shipped default is $shipped)"
			return 0
		fi
	else
		put "$shipped" "$conf" 644 || true
	fi
	line="$want  spotguard.yaml"
	if [ ! -f "$sumfile" ] || [ "$(cat "$sumfile")" != "$line" ]; then
		printf '%s\n' "$line" >"$sumfile.tmp.$$"
		chmod 644 "$sumfile.tmp.$$"
		mv -f "$sumfile.tmp.$$" "$sumfile"
		say "installed  $sumfile"
		changed=1
	fi
}

do_install() {
	if [ ! -f "$binary" ]; then
		echo "install.sh: no binary at $binary: run \`make build\` first, or pass --binary PATH" >&2
		exit 1
	fi
	if ! mkdir -p "$bindir" "$unitdir" "$confdir" 2>/dev/null || [ ! -w "$bindir" ] || [ ! -w "$unitdir" ] || [ ! -w "$confdir" ]; then
		echo "install.sh: cannot write under ${DESTDIR:-/}: run it as root (sudo make install)" >&2
		exit 1
	fi
	if put "$binary" "$bindir/spotguard" 755; then restart=1; fi
	units_changed=0
	for u in $units; do
		if put "$here/$u" "$unitdir/$u" 644; then
			units_changed=1
			restart=1
		fi
	done
	install_config
	if install_mounts; then units_changed=1; fi

	if systemd_running; then
		if [ $units_changed = 1 ]; then
			systemctl daemon-reload
			say "ran        systemctl daemon-reload"
		fi
		# Enabled only once the configuration sets something: the shipped default cannot run, and
		# an enabled unit would be skipped (systemd 251 and later) or fail (older) at every boot.
		configured=0
		if is_configured; then configured=1; fi
		if systemctl is-enabled --quiet spotguard.service 2>/dev/null; then
			:
		elif [ $configured = 1 ]; then
			systemctl enable --quiet spotguard.service
			say "enabled    spotguard.service (starts at boot)"
			changed=1
		fi
		if systemctl is-active --quiet spotguard.service; then
			if [ $restart = 1 ]; then
				systemctl try-restart spotguard.service
				say "restarted  spotguard.service"
			fi
		elif [ $configured = 0 ] && systemctl is-enabled --quiet spotguard.service 2>/dev/null; then
			say "not started: $conf sets nothing yet (spotguard.service, enabled, is skipped until it"
			say "           does): set the trainer (and the store), check it with \`spotguard config\`, then"
			say "           \`systemctl start spotguard\`"
		elif [ $configured = 0 ]; then
			say "not enabled: $conf sets nothing yet: set the trainer (and the store), check it with"
			say "           \`spotguard config\`, then \`systemctl enable --now spotguard\`"
		elif "$bindir/spotguard" config --config "$conf" >/dev/null 2>&1; then
			say "not started: the configuration is valid; start it with \`systemctl start spotguard\`"
		else
			say "not started: $conf has problems: see \`spotguard config\`, then \`systemctl start spotguard\`"
		fi
	elif [ -n "$DESTDIR" ]; then
		say "skipped    systemctl (DESTDIR is set)"
	else
		say "skipped    systemctl (systemd is not running); once configured: systemctl enable spotguard"
	fi
	if [ $changed = 0 ]; then
		say "nothing to do: spotguard is already installed under ${DESTDIR:-/}"
	fi
}

do_uninstall() {
	if systemd_running; then
		if [ -f "$unitdir/spotguard.service" ]; then
			# Also when it is between restarts (activating) or failed: no restart may follow.
			state=$(systemctl is-active spotguard.service || true)
			systemctl stop spotguard.service || true
			systemctl reset-failed spotguard.service 2>/dev/null || true
			case $state in
			inactive | failed | unknown) ;;
			*) say "stopped    spotguard.service (it was $state)" ;;
			esac
			if systemctl is-enabled --quiet spotguard.service 2>/dev/null; then
				systemctl disable --quiet spotguard.service
				say "disabled   spotguard.service"
			fi
		fi
		if [ -f "$unitdir/spotguard-restore.service" ]; then
			if systemctl is-enabled --quiet spotguard-restore.service 2>/dev/null; then
				systemctl disable --quiet spotguard-restore.service
				say "disabled   spotguard-restore.service"
			fi
			# Not stopped: that would stop every trainer unit that Requires= it.
			if systemctl is-active --quiet spotguard-restore.service; then
				say "left       spotguard-restore.service active (stopping it would stop the trainer units that"
				say "           require it); they will not start again without it"
			fi
		fi
	fi
	units_removed=0
	for u in $units; do
		if [ -f "$unitdir/$u" ]; then
			units_removed=1
		fi
		remove "$unitdir/$u"
	done
	if [ -f "$mounts_dropin" ]; then
		units_removed=1
		remove "$mounts_dropin"
		rmdir "$(dirname "$mounts_dropin")" 2>/dev/null || true
	fi
	remove "$bindir/spotguard"
	if [ -f "$conf" ]; then
		recorded=
		[ -f "$sumfile" ] && recorded=$(cut -d ' ' -f 1 "$sumfile")
		if [ -n "$recorded" ] && [ "$(sha256 "$conf")" = "$recorded" ]; then
			remove "$conf"
		else
			say "kept       $conf: it was edited; remove it yourself if you no longer need it"
		fi
	fi
	remove "$sumfile"
	if [ -d "$confdir" ] && rmdir "$confdir" 2>/dev/null; then
		say "removed    $confdir/"
		changed=1
	fi
	for u in $units; do
		if [ -d "$unitdir/$u.d" ]; then
			say "kept       $unitdir/$u.d/: your drop-ins"
		fi
	done
	if systemd_running && [ $units_removed = 1 ]; then
		systemctl daemon-reload
		say "ran        systemctl daemon-reload"
	fi
	if [ $changed = 0 ]; then
		say "nothing to do: spotguard is not installed under ${DESTDIR:-/}"
	fi
}

case $mode in
install) do_install ;;
uninstall) do_uninstall ;;
esac
