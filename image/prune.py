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
files), manuals, translations, glibc's gconv modules, the programs Setpoint
never runs (DROP_FILES) and then every shared library that no remaining
program or library links (DT_NEEDED), but for KEEP_LIBS; it fails if a
remaining ELF file needs a library that is not there. It writes the accounts
and directories the image runs with.
"""

import os
import re
import shutil
import stat
import struct
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
) + ("usr/bin/git-shell", "usr/bin/scalar") + (
    # OpenSSH's tools but ssh itself (git runs `ssh`; keys come from
    # Secrets, never an agent or a FIDO token), and tini's static twin (the
    # entrypoint is /usr/bin/tini).
    "usr/bin/scp", "usr/bin/sftp", "usr/bin/ssh-add", "usr/bin/ssh-agent", "usr/bin/ssh-argv0",
    "usr/bin/ssh-copy-id", "usr/bin/ssh-keygen", "usr/bin/ssh-keyscan", "usr/lib/openssh",
    "usr/bin/tini-static",
)

# Debian ships /usr/lib/git-core/git as a second copy of /usr/bin/git (3.5 MB):
# a link to it instead; the builtins' links in git-core point to it.
DUPLICATES = {"usr/lib/git-core/git": "../../bin/git"}

LIB_DIR = "usr/lib/x86_64-linux-gnu"
# Libraries kept though no file of the root filesystem links them: what the
# setpoint binary links (image/build.sh checks its DT_NEEDED against the root
# filesystem), and what glibc loads itself (libgcc_s to unwind, the NSS
# modules that nsswitch.conf names, the resolver).
KEEP_LIBS = {
    "ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libgcc_s.so.1", "libpthread.so.0", "libdl.so.2",
    "librt.so.1", "libresolv.so.2", "libnss_files.so.2", "libnss_dns.so.2",
}


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
    for path, target in DUPLICATES.items():
        full = os.path.join(root, path)
        if os.path.isfile(full) and not os.path.islink(full):
            os.unlink(full)
            os.symlink(target, full)
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
    for top in ("etc/alternatives", "usr/bin", "usr/sbin", "usr/lib/git-core", LIB_DIR):
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


def elf_dynamic(path):
    """(SONAME, [DT_NEEDED]) of a 64-bit little-endian ELF file, or None when
    it is not one (or is static)."""
    with open(path, "rb") as f:
        if f.read(6) != b"\x7fELF\x02\x01":
            return None
        data = b"\x7fELF\x02\x01" + f.read()
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return None
    entries, strtab = [], None
    for at in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, at)
        if tag == 0:
            break
        if tag == 5:
            strtab = next(off + value - vaddr for vaddr, off, size in loads if vaddr <= value < vaddr + size)
        entries.append((tag, value))

    def string(offset):
        return data[strtab + offset:data.index(b"\0", strtab + offset)].decode()

    soname = next((string(v) for t, v in entries if t == 14), None)
    return soname, [string(v) for t, v in entries if t == 1]


def elf_files(root):
    """The ELF files under /usr (merged /usr: all of them; not /proc, /sys
    and /dev, which mmdebstrap mounts while its hooks run)."""
    for dirpath, _, filenames in os.walk(os.path.join(root, "usr")):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path) and os.path.isfile(path):
                dynamic = elf_dynamic(path)
                if dynamic is not None:
                    yield path, dynamic


def remove_unlinked_libraries(root):
    """Removes the shared libraries of LIB_DIR that nothing links, then
    checks that every ELF file left finds each library it needs."""
    lib_dir = os.path.join(root, LIB_DIR)
    libraries, needed = {}, {}
    for path, (soname, deps) in elf_files(root):
        if os.path.dirname(path) == lib_dir and soname:
            libraries[soname] = path
        needed[path] = deps
    # From the programs (and plugins in subdirectories), through the libraries.
    wanted, todo = set(), list(KEEP_LIBS)
    todo += [dep for path, deps in needed.items() if os.path.dirname(path) != lib_dir for dep in deps]
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(needed.get(libraries.get(name), []))
    for soname, path in libraries.items():
        if soname not in wanted:
            os.unlink(path)
            del needed[path]
    remove_dangling_links(root)
    present = set(os.listdir(lib_dir))
    for path, deps in sorted(needed.items()):
        for dep in deps:
            if dep not in present:
                sys.exit(f"prune: {path[len(root):]} needs {dep}, which is not in the root filesystem")


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
    # dpkg's metadata but what scanners read (status, each package's file
    # list, checksums and conffiles): symbols and shlibs are for building
    # packages, maintainer scripts and triggers for dpkg, which is not there.
    info = os.path.join(root, "var/lib/dpkg/info")
    for name in os.listdir(info):
        if name.rsplit(".", 1)[-1] in ("symbols", "shlibs", "triggers", "preinst", "postinst", "prerm", "postrm",
                                        "config", "templates"):
            os.unlink(os.path.join(info, name))
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
    remove_unlinked_libraries(root)
    write_accounts_and_dirs(root)
    print(f"prune: kept {len(wanted)} packages, removed {len(removed)}: {' '.join(removed)}", file=sys.stderr)


if __name__ == "__main__":
    main()
