"""Write the chart's RBAC rules from the rights the code declares, or check they match.

    python scripts/chart_rbac.py           # write charts/paddlecloud/files/rbac/*.yaml
    python scripts/chart_rbac.py --check   # exit 1, naming the file, when one differs

The jobs service's rights are data in services/jobs/kube/rbac.py (`policy_rules(part)`):
jobs-cluster.yaml (per-user mode's cluster-wide ClusterRole; the chart puts the tenant
ClusterRole's name where rbac.TENANT_ROLE stands), jobs-tenant.yaml (the tenant
ClusterRole, bound in each user namespace) and jobs-shared.yaml (shared mode's Role). The
chart includes these files as the rules of those roles, so it grants exactly what the
code says it needs. tests/unit/test_helm_chart.py runs the check and compares the rendered Roles.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import yaml

from paddlecloud.jobs.kube import rbac

RBAC_DIR = Path(__file__).resolve().parent.parent / "charts" / "paddlecloud" / "files" / "rbac"
HEADER = "# Written by scripts/chart_rbac.py from {source}: do not edit (make chart-rbac).\n"


def builder_rules() -> list[dict[str, object]] | None:
    """The kaniko builder's Role rules, where this checkout's builder declares them."""
    try:
        module = importlib.import_module("paddlecloud.builder.rbac")
    except ImportError:
        return None
    rules: list[dict[str, object]] = module.policy_rules()
    return rules


def expected() -> dict[Path, str]:
    """Each file's text, as the code's lists give it."""
    files = {
        RBAC_DIR / f"jobs-{part}.yaml": HEADER.format(source="services/jobs/kube/rbac.py")
        + yaml.safe_dump(rbac.policy_rules(part), sort_keys=False)
        for part in ("cluster", "tenant", "shared")
    }
    # The Lease's Role (one leader); the chart puts the Lease's name for rbac.LEASE_NAME.
    leader = yaml.safe_dump(rbac.leader_rules(), sort_keys=False)
    files[RBAC_DIR / "jobs-leader.yaml"] = HEADER.format(source="services/jobs/kube/rbac.py") + leader
    rules = builder_rules()
    if rules is not None:
        files[RBAC_DIR / "builder-kaniko.yaml"] = HEADER.format(
            source="services/builder/rbac.py"
        ) + yaml.safe_dump(rules, sort_keys=False)
    return files


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    stale = []
    for path, text in expected().items():
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        print(f"{path} differs from the code's rights: run make chart-rbac", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
