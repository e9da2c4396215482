"""nvsharectl's output for share groups (Shares1): the JSON-ready dict, and the
text of `nvsharectl share` and of status' groups, as tables that keep their
figures whole and cut only the group's name, last, to the terminal's width.

A group's share is its part of the GPU time that the groups on that GPU used
over the last minute: the parts add up to 100 %.  The agent's own figure
("share", kept in --json) is the group's GPU time over the minute itself, which
adds up to more than 100 % where clients run beside each other (anti-thrash
off or auto), and to less while the GPU idles."""

import pwd

from .text_fit import WIDTH, fit, limit_text


def group_label(group: str) -> str:
    """A group as status shows it: user:1000 with the user's name where the node has one."""
    kind, _, name = group.partition(":")
    if kind == "user" and name.isdigit():
        try:
            return f"{group} ({pwd.getpwuid(int(name)).pw_name})"
        except (KeyError, OverflowError):
            return group
    return group


def with_parts(groups: list) -> list:
    """Each group with "part": its part (0..1) of the GPU time the groups on its GPU
    used over the last minute (their "share"s, over their sum; 0 where none used any)."""
    used: dict = {}
    for group in groups:
        used[group["gpu"]] = used.get(group["gpu"], 0.0) + max(group.get("share", 0.0), 0.0)
    return [
        {
            **group,
            "part": max(group.get("share", 0.0), 0.0) / used[group["gpu"]]
            if used[group["gpu"]] > 0
            else 0.0,
        }
        for group in groups
    ]


def shares_as_dict(properties: dict) -> dict:
    """Shares1's properties as nvsharectl's --json shows them."""
    groups = sorted(properties.get("Groups", []), key=lambda g: (g["gpu"], g["group"]))
    return {
        "share_by": properties.get("ShareBy", "user"),
        "shares": properties.get("Shares", {}),
        "groups": with_parts(groups),
    }


GROUP_HEADER = ("WEIGHT", "CAP", "USE", "SHARE", "CLIENTS", "GROUP")
SHARE_NOTE = "SHARE: of the GPU time the groups used here over the last minute (adds to 100 %)"


def groups_table(groups: list, width: int = WIDTH, indent: str = "  ") -> list:
    """One GPU's groups, a row each: the figures first, whole; the group last."""
    rows = [GROUP_HEADER] + [
        (
            str(g["weight"]),
            limit_text(g["memory_cap_bytes"]),
            f"{g['use']:.2f}",
            f"{g.get('part', 0.0) * 100:.0f} %",
            str(g["clients"]),
            group_label(g["group"]),
        )
        for g in groups
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = []
    for row in rows:
        cells = [row[i].rjust(widths[i]) if i != 1 else row[i].ljust(widths[i]) for i in range(5)]
        lines.append(fit(indent + "  ".join(cells + [row[5]]), width))
    return lines


def shares_text(shares: dict, width: int = WIDTH, gpu_labels: dict | None = None) -> str:
    """nvsharectl share: what a group is, the groups' settings, each GPU's groups."""
    lines = [f"share by: {shares['share_by']}"]
    if shares["shares"]:
        lines.append("settings:")
        for group, fields in sorted(shares["shares"].items()):
            weight = fields.get("weight", 1)
            cap = limit_text(fields.get("memory_cap_bytes", 0))
            lines.append(f"  weight {weight}  memory cap {cap}  {group_label(group)}")
    else:
        lines.append("settings: none (every group weight 1, no cap)")
    gpus = list(dict.fromkeys(g["gpu"] for g in shares["groups"]))
    for gpu in gpus:
        label = (gpu_labels or {}).get(gpu)
        lines += ["", f"GPU {label}  {gpu}" if label else f"GPU {gpu}"]
        lines += groups_table([g for g in shares["groups"] if g["gpu"] == gpu], width)
    if gpus:
        lines += ["", SHARE_NOTE]
    return "\n".join(fit(line, width) for line in lines)
