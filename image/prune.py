#!/usr/bin/env python3
"""Prunes a Debian root filesystem to what Setpoint's image runs.

    prune.py ROOT PACKAGES_TXT

Run by image/rootfs.sh as mmdebstrap's customize hook, on the host, with
ROOT the root filesystem that mmdebstrap installed. It keeps the dependency
closure (Pre-Depends and Depends, first installed alternative, virtual
packages through Provides) of the `keep` packages of PACKAGES_TXT, without
following the `skip` names, and removes every other package: its files, its
dpkg metadata and its stanza in /var/lib/dpkg/status, so that the status
file (which the SBOM and image scanners read) lists exactly what is there.
From the kept packages it removes documentation (except the copyright
files), manuals, translations and glibc's gconv modules, and it writes the
accounts and directories the image runs with.
"""

import os
import re
import shutil
import stat
import sys

UID = 65532
CACHE_DIR = "var/cache/setpoint"

# Not needed at run time, whichever package ships them; copyright files stay.
DROP_PREFIXES = (
    "usr/share/doc/",
    "usr/share/man/",
    "usr/share/info/",
    "usr/share/locale/",
    "usr/share/lintian/",
    "usr/share/bug/",
    "usr/share/doc-base/",
    "usr/share/bash-completion/",
    "usr/share/gitweb/",
    "usr/lib/x86_64-linux-gnu/gconv/",
)

# git's programs that Setpoint never runs (it runs git itself, git-remote-http
# for http(s), upload-pack for local repositories, ssh): servers, the dumb
# HTTP walker, mail, scalar, the shell scripts that need the tools pruned
# above. About 2 MB each, 20 MB in all.
DROP_FILES = tuple(
    "usr/lib/git-core/" + name
    for name in (
        "git-daemon", "git-http-backend", "git-http-fetch", "git-http-push", "git-imap-send",
        "git-shell", "git-sh-i18n--envsubst", "scalar", "git-instaweb", "git-filter-branch",
        "git-subtree", "git-add--interactive", "git-difftool--helper", "git-mergetool",
        "git-mergetool--lib", "git-request-pull", "git-web--browse", "git-quiltimport",
        "git-submodule", "git-sh-prompt", "git-sh-i18n", "git-sh-setup", "git-merge-octopus",
        "git-merge-one-file", "git-merge-resolve", "mergetools",
    )
) + ("usr/bin/git-shell", "usr/bin/scalar")


def parse_packages_txt(path):
    suite, keep, skip = None, [], set()
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) != 2 or words[0] not in ("suite", "keep", "skip"):
                sys.exit(f"{path}:{number}: expected `suite|keep|skip NAME`, got {line.strip()!r}")
            if words[0] == "suite":
                suite = words[1]
            elif words[0] == "keep":
                keep.append(words[1])
            else:
                skip.add(words[1])
    return suite, keep, skip


def parse_status(text):
    """The stanzas of a dpkg status file, in order, each as (fields, raw)."""
    stanzas = []
    for raw in text.strip("\n").split("\n\n"):
        fields, key = {}, None
        for line in raw.split("\n"):
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line
            elif ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        stanzas.append((fields, raw))
    return stanzas


def relations(value):
    """`a (>= 1) | b, c:any` -> [["a", "b"], ["c"]]"""
    groups = []
    for group in value.split(","):
        names = [re.split(r"[\s(:]", alt.strip(), maxsplit=1)[0] for alt in group.split("|")]
        names = [n for n in names if n]
        if names:
            groups.append(names)
    return groups


def closure(stanzas, keep, skip):
    installed = {f["Package"]: f for f, _ in stanzas if "installed" in f.get("Status", "")}
    providers = {}
    for name, fields in installed.items():
        for group in relations(fields.get("Provides", "")):
            providers.setdefault(group[0], []).append(name)
    wanted, todo = set(), list(keep)
    for name in keep:
        if name not in installed:
            sys.exit(f"prune: `keep {name}` is not installed in the root filesystem")
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        fields = installed[name]
        deps = fields.get("Pre-Depends", "") + "," + fields.get("Depends", "")
        for group in relations(deps):
            if any(alt in skip for alt in group):
                continue
            chosen = next((alt for alt in group if alt in installed), None)
            if chosen is None:
                chosen = next((p for alt in group for p in sorted(providers.get(alt, []))), None)
            if chosen is None:
                sys.exit(f"prune: {name} depends on {' | '.join(group)}, which is not installed")
            if chosen not in skip:
                todo.append(chosen)
    return wanted


def info_files(root, package):
    info = os.path.join(root, "var/lib/dpkg/info")
    return sorted(
        os.path.join(info, f)
        for f in os.listdir(info)
        if f.rsplit(".", 1)[0] in (package, package + ":amd64")
    )


def listed_paths(root, package):
    for path in info_files(root, package):
        if path.endswith(".list"):
            with open(path, encoding="utf-8") as f:
                return [line.rstrip("\n") for line in f if line.strip() not in ("", "/.")]
    return []


def remove_packages(root, stanzas, wanted):
    kept_paths = set()
    for fields, _ in stanzas:
        if fields["Package"] in wanted:
            kept_paths.update(listed_paths(root, fields["Package"]))
    doomed, dirs = [], set()
    for fields, _ in stanzas:
        name = fields["Package"]
        if name in wanted:
            continue
        for path in listed_paths(root, name):
            if path in kept_paths:
                continue
            full = root + path
            try:
                mode = os.lstat(full).st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(mode) or (stat.S_ISLNK(mode) and os.path.isdir(full)):
                dirs.add(full)
            else:
                doomed.append(full)
        doomed.extend(info_files(root, name))
    for path in doomed:
        if os.path.lexists(path):
            os.unlink(path)
    for path in sorted(dirs, key=lambda p: p.count("/"), reverse=True):
        if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
            os.rmdir(path)
    kept = [raw for fields, raw in stanzas if fields["Package"] in wanted]
    with open(os.path.join(root, "var/lib/dpkg/status"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(kept) + "\n")


def drop_unneeded_files(root):
    for path in DROP_FILES:
        full = os.path.join(root, path)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)
        elif os.path.lexists(full):
            os.unlink(full)
    for prefix in DROP_PREFIXES:
        top = os.path.join(root, prefix)
        if not os.path.isdir(top):
            continue
        for dirpath, dirnames, filenames in os.walk(top, topdown=False):
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                if not (prefix == "usr/share/doc/" and name == "copyright"):
                    os.unlink(os.path.join(dirpath, name))
            if not os.listdir(dirpath):
                os.rmdir(dirpath)


def remove_dangling_links(root):
    """Alternatives (awk, pager) whose package is gone, links to dropped files."""
    for top in ("etc/alternatives", "usr/bin", "usr/sbin", "usr/lib/git-core"):
        for dirpath, _, filenames in os.walk(os.path.join(root, top)):
            for name in filenames:
                path = os.path.join(dirpath, name)
                if os.path.islink(path):
                    target = os.readlink(path)
                    resolved = root + target if target.startswith("/") else os.path.join(dirpath, target)
                    # Through /etc/alternatives: one more hop, inside ROOT.
                    while os.path.islink(resolved) and os.readlink(resolved).startswith("/"):
                        resolved = root + os.readlink(resolved)
                    if not os.path.exists(resolved):
                        os.unlink(path)


def remove_tree_contents(path):
    if os.path.isdir(path):
        for name in os.listdir(path):
            full = os.path.join(path, name)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)


def write_accounts_and_dirs(root):
    """root and the image's user (65532, as distroless's `nonroot`), which ssh
    needs to find in /etc/passwd; the cache and /tmp, which the chart mounts as
    emptyDir volumes."""
    home = "/" + CACHE_DIR
    files = {
        "etc/passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\nnonroot:x:{UID}:{UID}:nonroot:{home}:/usr/sbin/nologin\n",
        "etc/group": f"root:x:0:\nnonroot:x:{UID}:\n",
        "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\nservices: files\n",
    }
    for path, text in files.items():
        with open(os.path.join(root, path), "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(os.path.join(root, path), 0o644)
    for path in ("etc/shadow", "etc/gshadow", "etc/passwd-", "etc/group-", "etc/shadow-", "etc/gshadow-"):
        if os.path.lexists(os.path.join(root, path)):
            os.unlink(os.path.join(root, path))
    cache = os.path.join(root, CACHE_DIR)
    os.makedirs(cache, exist_ok=True)
    os.chown(cache, UID, UID)
    os.chmod(cache, 0o755)
    os.makedirs(os.path.join(root, "tmp"), exist_ok=True)
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    # Written by mmdebstrap from the host, or left by apt and dpkg.
    for path in ("etc/hostname", "etc/resolv.conf", "etc/machine-id", "etc/apt"):
        full = os.path.join(root, path)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)
        elif os.path.lexists(full):
            os.unlink(full)
    for path in ("var/log", "var/cache/apt", "var/cache/debconf", "var/cache/ldconfig", "var/lib/apt"):
        remove_tree_contents(os.path.join(root, path))
    for path in ("available", "available-old", "status-old", "diversions-old", "statoverride-old", "lock", "lock-frontend", "triggers/Lock"):
        full = os.path.join(root, "var/lib/dpkg", path)
        if os.path.lexists(full):
            os.unlink(full)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    root, packages_txt = sys.argv[1].rstrip("/"), sys.argv[2]
    _, keep, skip = parse_packages_txt(packages_txt)
    status_path = os.path.join(root, "var/lib/dpkg/status")
    with open(status_path, encoding="utf-8") as f:
        stanzas = parse_status(f.read())
    wanted = closure(stanzas, keep, skip)
    removed = sorted(f["Package"] for f, _ in stanzas if f["Package"] not in wanted)
    remove_packages(root, stanzas, wanted)
    drop_unneeded_files(root)
    remove_dangling_links(root)
    write_accounts_and_dirs(root)
    print(f"prune: kept {len(wanted)} packages, removed {len(removed)}: {' '.join(removed)}", file=sys.stderr)


if __name__ == "__main__":
    main()
