#!/usr/bin/env python3
"""What each part of Setpoint's image unpacks to, in MiB, on stdout.

    sizes.py CONTEXT PACKAGES_TXT

CONTEXT is a build context as image/build.sh makes it (rootfs.tar, setpoint,
renderers.tar). The files of the root filesystem are counted by the Debian
package that installed them (its dpkg file list in the tarball), and the
packages grouped by the `keep` package of PACKAGES_TXT whose dependency
closure alone holds them (git and the libraries only git needs; ssh and its);
what several share (glibc, zlib, ...) and the rest is the base. Regular files
only: links and directories add no bytes. Run by `image/build.sh sizes`.
"""

import os
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prune import closure, parse_packages_txt, parse_status  # noqa: E402

MIB = 1048576


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    context, packages_txt = sys.argv[1], sys.argv[2]
    _, keep, skip = parse_packages_txt(packages_txt)
    with tarfile.open(os.path.join(context, "rootfs.tar")) as tar:
        members = [m for m in tar.getmembers() if m.isreg()]
        files = {m.name[1:] if m.name.startswith("./") else "/" + m.name: m.size for m in members}
        status = tar.extractfile("./var/lib/dpkg/status").read().decode()
        owner = {}
        for m in members:
            if m.name.endswith(".list") and "/var/lib/dpkg/info/" in "/" + m.name.lstrip("."):
                package = os.path.basename(m.name)[: -len(".list")].split(":")[0]
                for line in tar.extractfile(m).read().decode().splitlines():
                    owner.setdefault(line, package)
    stanzas = parse_status(status)
    closures = {k: closure(stanzas, [k], skip) for k in keep}
    group = {}
    for fields, _ in stanzas:
        name = fields["Package"]
        holders = [k for k, c in closures.items() if name in c]
        group[name] = holders[0] if len(holders) == 1 and holders[0] in ("git", "openssh-client") else "base"
    sums = {}
    for path, size in files.items():
        part = group.get(owner.get(path), "base")
        sums[part] = sums.get(part, 0) + size
    with tarfile.open(os.path.join(context, "renderers.tar")) as tar:
        renderers = sum(m.size for m in tar.getmembers() if m.isreg())
    rows = [
        ("setpoint", os.path.getsize(os.path.join(context, "setpoint"))),
        ("helm + kustomize (one binary)", renderers),
        ("git and the libraries only it needs", sums.get("git", 0)),
        ("ssh and the libraries only it needs", sums.get("openssh-client", 0)),
        ("base (glibc, shared libraries, CA bundle, tini, dash, dpkg status)", sums.get("base", 0)),
    ]
    for name, size in rows:
        print(f"{size / MIB:7.1f}  {name}")
    print(f"{sum(size for _, size in rows) / MIB:7.1f}  total")


if __name__ == "__main__":
    main()
