#!/usr/bin/env python3
"""The SPDX 2.3 JSON SBOM of Setpoint's image, on stdout.

    sbom.py --name setpoint --version V --revision SHA --created RFC3339
            --digest sha256:... --dpkg-status FILE --cargo-manifest Cargo.toml
            --go-binary renderers=PATH

What it lists: the Debian packages of the root filesystem (its dpkg status
file, as pruned), the Rust crates compiled into the setpoint binary (`cargo
metadata`, the normal dependencies for the Linux target, with Cargo.lock's
checksums), and the Go modules of each Go binary (`go version -m`; the
image's is helm and kustomize in one, image/renderers). cargo reads the
crates' manifests, downloading those Cargo.lock pins that are not in
CARGO_HOME yet (a fresh clone has none of the dev-dependencies, which cargo
metadata resolves too): --locked, so nothing but the lock decides what is
listed. The same inputs give the same bytes.
"""

import argparse
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import quote

TARGET = "x86_64-unknown-linux-gnu"


def spdx_id(*parts):
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]", "-", "-".join(parts))


def license_expression(text):
    """Cargo's old `MIT/Apache-2.0` is `MIT OR Apache-2.0` in SPDX."""
    if not text:
        return "NOASSERTION"
    return " OR ".join(part.strip() for part in text.split("/")) if "/" in text else text


def package(ident, name, version, purl, **extra):
    entry = {
        "SPDXID": ident,
        "name": name,
        "versionInfo": version,
        "downloadLocation": extra.pop("download", "NOASSERTION"),
        "filesAnalyzed": False,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": extra.pop("license", "NOASSERTION"),
        "copyrightText": "NOASSERTION",
        "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}],
    }
    entry.update(extra)
    return entry


def debian_packages(status_path):
    text = Path(status_path).read_text(encoding="utf-8")
    for stanza in text.strip().split("\n\n"):
        fields = {}
        for line in stanza.split("\n"):
            if line[:1] not in (" ", "\t") and ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        if "installed" not in fields.get("Status", ""):
            continue
        name, version, arch = fields["Package"], fields["Version"], fields.get("Architecture", "all")
        extra = {"supplier": "Organization: Debian", "comment": f"Debian package, source {fields.get('Source', name)}"}
        if "Maintainer" in fields:
            # SPDX writes `Name (email)` where Debian writes `Name <email>`.
            extra["originator"] = "Person: " + re.sub(r"\s*<([^>]*)>", r" (\1)", fields["Maintainer"])
        yield package(
            spdx_id("deb", name),
            name,
            version,
            f"pkg:deb/debian/{name}@{quote(version, safe='')}?arch={arch}&distro=debian-12",
            **extra,
        )


def rust_crates(manifest):
    run = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", TARGET,
         "--manifest-path", str(manifest)],
        capture_output=True, text=True,
    )
    if run.returncode != 0:
        sys.exit(f"sbom: cargo metadata failed: {run.stderr.strip()}")
    metadata = json.loads(run.stdout)
    lock = tomllib.loads((Path(manifest).parent / "Cargo.lock").read_text(encoding="utf-8"))
    checksums = {(p["name"], p["version"]): p.get("checksum") for p in lock["package"]}
    packages = {p["id"]: p for p in metadata["packages"]}
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    root = metadata["resolve"]["root"]
    # Normal dependencies only: what is compiled into the binary (build
    # scripts and dev-dependencies are not).
    seen, todo = set(), [root]
    while todo:
        ident = todo.pop()
        if ident in seen:
            continue
        seen.add(ident)
        for dep in nodes[ident]["deps"]:
            if any(kind["kind"] is None for kind in dep["dep_kinds"]):
                todo.append(dep["pkg"])
    crates = []
    for ident in sorted(seen - {root}, key=lambda i: (packages[i]["name"], packages[i]["version"])):
        crate = packages[ident]
        name, version = crate["name"], crate["version"]
        extra = {"license": license_expression(crate.get("license"))}
        if (crate.get("source") or "").startswith("registry+"):
            extra["download"] = f"https://crates.io/api/v1/crates/{name}/{version}/download"
        if checksums.get((name, version)):
            extra["checksums"] = [{"algorithm": "SHA256", "checksumValue": checksums[(name, version)]}]
        crates.append(package(spdx_id("crate", name, version), name, version, f"pkg:cargo/{name}@{version}", **extra))
    return crates


def go_modules(label, path, own_version):
    """The main module and the dependencies `go version -m` reads from the
    binary. A main module of this repository (version `(devel)`) has the
    image's version."""
    out = subprocess.run(["go", "version", "-m", path], check=True, capture_output=True, text=True).stdout
    main, deps, toolchain = None, [], None
    for line in out.splitlines():
        words = line.split()
        if not words:
            continue
        if line.startswith(path + ":"):
            toolchain = words[-1]
        elif words[0] == "mod":
            main = (words[1], own_version if words[2] == "(devel)" else words[2])
        elif words[0] == "dep":
            deps.append((words[1], words[2]))
        elif words[0] == "=>" and deps:
            deps[-1] = (words[1], words[2])
    binary = package(
        spdx_id("go", label),
        label,
        main[1] if main else "NOASSERTION",
        f"pkg:golang/{main[0]}@{main[1]}" if main else f"pkg:generic/{label}",
        comment=f"{label}, built with {toolchain} from the Go module {main[0] if main else 'unknown'}, its modules at the versions the tests use",
    )
    modules = [
        package(spdx_id("gomod", label, mod, version), mod, version, f"pkg:golang/{mod}@{version}")
        for mod, version in sorted(set(deps))
    ]
    return binary, modules


def main():
    parser = argparse.ArgumentParser()
    for flag in ("--name", "--version", "--revision", "--created", "--digest", "--dpkg-status", "--cargo-manifest"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--go-binary", action="append", default=[], help="LABEL=PATH")
    args = parser.parse_args()

    image_id = spdx_id("image", args.name)
    packages = [
        package(
            image_id,
            args.name,
            args.version,
            f"pkg:oci/{args.name}@{quote(args.digest, safe='')}?tag={args.version}",
            primaryPackagePurpose="CONTAINER",
            license="Apache-2.0",
            comment=f"the OCI image of {args.name}, revision {args.revision}",
        )
    ]
    relationships = [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": image_id}]

    def contains(parent, children):
        for child in children:
            packages.append(child)
            relationships.append({"spdxElementId": parent, "relationshipType": "CONTAINS" if parent == image_id else "DEPENDS_ON",
                                  "relatedSpdxElement": child["SPDXID"]})

    binary_id = spdx_id("cargo", args.name)
    contains(image_id, [package(binary_id, args.name, args.version, f"pkg:cargo/{args.name}@{args.version}",
                                license="Apache-2.0", primaryPackagePurpose="APPLICATION")])
    contains(binary_id, rust_crates(args.cargo_manifest))
    for spec in args.go_binary:
        label, path = spec.split("=", 1)
        binary, modules = go_modules(label, path, args.version)
        contains(image_id, [binary])
        contains(binary["SPDXID"], modules)
    contains(image_id, list(debian_packages(args.dpkg_status)))

    document = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{args.name}-{args.version}",
        "documentNamespace": f"https://setpoint.invalid/spdx/{args.name}-{args.version}-{args.digest.replace(':', '-')}",
        "creationInfo": {"created": args.created, "creators": ["Tool: setpoint-image-sbom (image/sbom.py)"]},
        "packages": packages,
        "relationships": relationships,
    }
    json.dump(document, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
