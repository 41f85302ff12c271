"""`arcvllm release`: build, verify and compare a release (arcvllm.builder.release)."""

from __future__ import annotations

import json
from pathlib import Path

from arcvllm import options
from arcvllm.builder import release
from arcvllm.errors import CheckFailed, UsageError, status


def _compare(args) -> int:
    if args.json:
        differ = release.compare(args.first, args.second)
        digests = (release.layout_digest(args.first), release.layout_digest(args.second))
        print(json.dumps({"digests": digests, "differ": differ}, indent=2))
        return status(bool(differ))
    differ = release.compared(args.first, args.second, args.limit)
    if differ:
        raise CheckFailed(f"the two builds differ in {len(differ)} files")
    return 0


def _reproducible(args) -> int:
    names = [n for raw in args.images for n in raw.split(",") if n]
    differ = release.reproducible(names, args.builds.split(), args.out)
    if args.json:
        print(json.dumps({"images": names, "differ": differ}))
    if differ:
        raise CheckFailed(f"two clean builds differ: {', '.join(differ)}")
    return 0


def _print_manifest(manifest: dict, args) -> None:
    if args.json:
        print(json.dumps(manifest, indent=2))
        return
    for e in manifest["images"]:
        print(f"{e['name']:14} {e['ref']}")
    print(f"manifest: {args.out / 'manifest.json'}")


def _assemble(args) -> int:
    manifest = release.assemble(args.parts, args.out, _names(args.stacks), _names(args.sides))
    _print_manifest(manifest, args)
    return 0


def _entry(args) -> int:
    found = release.entry(args.manifest, args.name)
    if args.field not in found:
        raise UsageError(f"no field {args.field!r} (it has: {', '.join(found)})")
    print(json.dumps(found[args.field]) if args.json else found[args.field])
    return 0


def _verify(args) -> int:
    signer = release.Signer.of(
        args.key, args.certificate_identity_regexp, args.certificate_oidc_issuer
    )
    results = release.verify(args.manifest, signer)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['ref']}  {r['detail']}")
    return status(not all(r["ok"] for r in results))


def _build(args) -> int:
    stacks, sides = _names(args.stacks), _names(args.sides)
    manifest = release.release(args.version, args.registry, args.key, args.out, stacks, sides)
    _print_manifest(manifest, args)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "release",
        help="build, push, sign and attest every image; verify a release's signatures",
        description="`release build`: every stack and side image built reproducibly, pushed "
        "to REGISTRY, signed with a cosign key, its SBOM attested, and manifest.json "
        "written. `release verify`: cosign's verdict on every digest of a manifest.",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    b = sub.add_parser("build", help="the release (make release VERSION=...)")
    b.add_argument("--version", required=True)
    b.add_argument("--registry", required=True, help="HOST[:PORT][/PATH] to push to")
    b.add_argument(
        "--key", type=Path, required=True, help="cosign private key (COSIGN_PASSWORD), or `keyless`"
    )
    b.add_argument("--out", type=Path, required=True, help="folder for layouts and manifest")
    b.add_argument("--stacks", help="comma-separated stacks (default: all; '' for none)")
    b.add_argument("--sides", help="comma-separated side images (default: all; '' for none)")
    v = sub.add_parser(
        "verify",
        help="verify every digest of a manifest: by a public key, or by the keyless signer's "
        "identity",
        description="cosign's verdict on every digest of a manifest: its signature, SBOM and "
        "provenance attestations. A key pair's release: --key cosign.pub. The hosted, keyless "
        f"release: --certificate-identity-regexp '{release.RELEASE_IDENTITY_REGEXP}' "
        f"--certificate-oidc-issuer {release.GITHUB_OIDC_ISSUER} (cosign's flags).",
    )
    v.add_argument("manifest", type=options.existing_file)
    v.add_argument("--key", type=options.existing_file, help="cosign public key (a key pair's)")
    v.add_argument(
        "--certificate-identity-regexp",
        metavar="RE",
        help="keyless: the signing identity (the release workflow's URL), a regular expression",
    )
    v.add_argument(
        "--certificate-oidc-issuer",
        metavar="URL",
        help=f"keyless: who issued that identity (GitHub Actions: {release.GITHUB_OIDC_ISSUER})",
    )
    c = sub.add_parser("compare", help="two builds' OCI layouts: one digest, or what differs")
    c.add_argument("first", type=options.existing_dir)
    c.add_argument("second", type=options.existing_dir)
    c.add_argument("--limit", type=int, default=40, help="how many differing files to name")
    r = sub.add_parser(
        "reproducible",
        help="build images twice with no cache and compare the digests (names what differs)",
    )
    r.add_argument("images", nargs="+", help="stacks and side images (cpu, router, ...)")
    r.add_argument("--builds", default="1 2", help="`1 2` (default), or `2` beside a NAME-1")
    r.add_argument("--out", type=Path, default=Path("build/reproducible"), help="the layouts")
    a = sub.add_parser(
        "assemble",
        help="one manifest from the parts a release's jobs wrote (one stack, or the side "
        "images, each)",
    )
    a.add_argument("parts", nargs="+", type=options.existing_dir, help="each job's folder")
    a.add_argument("--out", type=Path, required=True, help="the release's folder")
    a.add_argument("--stacks", help="the release's stacks (default: all; '' for none)")
    a.add_argument("--sides", help="its side images (default: all; '' for none)")
    e = sub.add_parser("entry", help="one field of one image's manifest entry (ref, layout, ...)")
    e.add_argument("manifest", type=options.existing_file)
    e.add_argument("name", help="a stack or side image (cpu, gateway, ...)")
    e.add_argument("field", help="ref, digest, layout, repository, ...")
    handlers = (_build, _verify, _compare, _reproducible, _assemble, _entry)
    for each, handler in zip((b, v, c, r, a, e), handlers, strict=True):
        options.add_json(each)
        each.set_defaults(func=handler)


def _names(raw: str | None) -> list[str] | None:
    """A comma-separated option: None when absent (all), [] when empty (none)."""
    return None if raw is None else [n for n in raw.split(",") if n]
