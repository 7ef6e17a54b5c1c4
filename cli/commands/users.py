"""Admin commands for users: `users list|create|delete|quota`, and `get users`."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ..context import Context, UsageError
from ..errors import PaddleCloudError
from ..flags import add_flag
from ..output import Column, render_record, render_table
from . import CommandTree

ORDER = 30
UNLIMITED_WORDS = ("unlimited", "none")
# 18 random bytes: 24 URL-safe characters, 144 bits; typed once, so length costs nothing.
GENERATED_PASSWORD_BYTES = 18


def _limit(value: Any) -> Any:
    return "unlimited" if value is None else value


def _quota_of(key: str) -> Any:
    def get(row: Mapping[str, Any]) -> Any:
        return _limit((row.get("quota") or {}).get(key))

    return get


USER_COLUMNS: list[Column] = [
    ("NAME", "name"),
    ("ADMIN", "admin"),
    ("CPU", _quota_of("cpu")),
    ("GPU", _quota_of("gpu")),
    ("MEMORY", _quota_of("memory")),
    ("JOBS", _quota_of("jobs")),
    ("STORAGE", _quota_of("storage")),
    ("DISK", _quota_of("disk")),
    ("CREATED", "created_at"),
]
QUOTA_FIELDS: list[Column] = [
    ("User", "name"),
    ("CPU", _quota_of("cpu")),
    ("GPU", _quota_of("gpu")),
    ("Memory", _quota_of("memory")),
    ("Jobs", _quota_of("jobs")),
    ("Storage", _quota_of("storage")),
    ("Disk", _quota_of("disk")),
]


async def list_users(ctx: Context, args: argparse.Namespace) -> int:
    answer = await ctx.client().request("GET", "users")
    users = answer.get("users") if isinstance(answer, dict) else None
    rows = users if isinstance(users, list) else []
    ctx.emit(answer, lambda: render_table(rows, USER_COLUMNS, empty="No users."))
    return 0


def _password(ctx: Context, args: argparse.Namespace) -> tuple[str, bool]:
    """The password to set and whether it was generated here."""
    if args.password_stdin:
        password = ctx.stdin.readline().rstrip("\r\n")
        if not password:
            raise UsageError("--password-stdin: stdin gave an empty password")
        return password, False
    if args.password is not None:
        if not args.password:
            raise UsageError("--password: the password is empty")
        return args.password, False
    import secrets  # here: it imports hmac and random, which `--help` need not pay for

    return secrets.token_urlsafe(GENERATED_PASSWORD_BYTES), True


async def create_user(ctx: Context, args: argparse.Namespace) -> int:
    password, generated = _password(ctx, args)
    user = await ctx.client().create_user(args.name, password, admin=args.admin)
    # A generated password exists nowhere else: scripts get it in the data, people on screen.
    data = {**user, "password": password} if generated else user

    def text() -> str:
        role = " (admin)" if user.admin else ""
        lines = [f"Created user {user.name if 'name' in user else args.name}{role}."]
        if generated:
            lines.append(f"Password (shown only this once): {password}")
        if isinstance(user.get("quota"), Mapping):
            lines.append(_quota_line(user["quota"], args.name))
        return "\n".join(lines)

    ctx.emit(data, text)
    return 0


def _quota_line(quota: Mapping[str, Any], name: str) -> str:
    """What a new user may use, in one line: the server's default quota for new users."""
    from ..client import QUOTA_KEYS

    if all(quota.get(key) is None for key in QUOTA_KEYS):
        return (
            f"Quota: unlimited; set one with `paddlecloud users quota {name}`, "
            "or one for every new user with gateway.default_quota."
        )
    return "Quota: " + ", ".join(f"{key} {_limit(quota.get(key))}" for key in QUOTA_KEYS) + "."


async def delete_user(ctx: Context, args: argparse.Namespace) -> int:
    await ctx.client().delete_user(args.name, remove_home=args.remove_home)
    home = "removed" if args.remove_home else "archived on the server"
    ctx.emit(
        {"deleted": args.name, "home": "removed" if args.remove_home else "archived"},
        lambda: f"Deleted user {args.name}: their jobs are stopped and forgotten, their home {home}.",
    )
    return 0


async def quota(ctx: Context, args: argparse.Namespace) -> int:
    from ..client import QUOTA_KEYS

    client = ctx.client()
    given = vars(args)
    changes = {key: given[key] for key in QUOTA_KEYS if key in given}
    user = next((u for u in await client.users() if u.name == args.name), None)
    if user is None:
        raise PaddleCloudError(f"there is no user {args.name!r}")
    if changes:
        # PUT replaces the whole quota and a missing key means unlimited, so send every key:
        # `quota bob -gpu 1` must not lift the cpu limit set last week.
        limits = {key: user.quota.get(key) for key in QUOTA_KEYS}
        limits.update(changes)
        user = await client.set_quota(args.name, **limits)
    ctx.emit(user, lambda: render_record(user, QUOTA_FIELDS))
    return 0


def _quantity(value: str) -> str | None:
    if value.strip().lower() in UNLIMITED_WORDS:
        return None
    if not value.strip():
        raise argparse.ArgumentTypeError("expected a quantity such as 4, 500m or 8Gi, or 'unlimited'")
    return value.strip()


def _count(value: str) -> int | None:
    if value.strip().lower() in UNLIMITED_WORDS:
        return None
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'unlimited', got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {number}")
    return number


def register(tree: CommandTree) -> None:
    users = tree.group(
        "users",
        help="manage users (admins only)",
        description="Manage the users of a datacenter. Only admins may.",
        epilog=(
            "examples:\n"
            "  paddlecloud users list\n"
            "  paddlecloud users create bob\n"
            "  paddlecloud users quota bob -cpu 8 -gpu 1 -memory 32Gi\n"
            "  paddlecloud users delete bob\n"
        ),
    )
    list_epilog = "examples:\n  paddlecloud users list\n  paddlecloud get users -o json\n"
    users.command("list", list_users, help="list users and their quotas", epilog=list_epilog, aliases=["ls"])
    tree.group("get").command("users", list_users, help="list users and their quotas", epilog=list_epilog)

    create = users.command(
        "create",
        create_user,
        help="create a user",
        description=(
            "Create a user. Without --password or --password-stdin a strong password is\n"
            "generated and printed once: pass it on, it cannot be shown again. The user starts\n"
            "with the server's quota for new users (gateway.default_quota; unlimited unless an\n"
            "operator set one), printed too; `users quota NAME` changes it."
        ),
        epilog=(
            "examples:\n"
            "  paddlecloud users create bob\n"
            "  paddlecloud users create carol --admin\n"
            "  printf '%s\\n' \"$PASSWORD\" | paddlecloud users create dave --password-stdin\n"
        ),
    )
    create.add_argument(
        "name",
        metavar="NAME",
        help=(
            "the new user's name: 1 to 32 lowercase letters, digits and '-' (it names their PFS "
            "home and Kubernetes namespace; for an e-mail address, use its local part)"
        ),
    )
    secret = create.add_mutually_exclusive_group()
    add_flag(secret, "password", metavar="P", help="the password (visible to other local users in ps)")
    add_flag(secret, "password-stdin", action="store_true", help="read the password from stdin's first line")
    add_flag(create, "admin", action="store_true", help="make the user an admin")

    delete = users.command(
        "delete",
        delete_user,
        help="delete a user: tokens, jobs and home",
        description=(
            "Delete a user so that nothing of theirs stays reachable: their tokens are revoked,\n"
            "their jobs stopped and removed from history, and their home archived on the server\n"
            "(out of /pfs, for an operator to restore or drop) or, with --remove-home, removed.\n"
            "An account created later with the same name starts with no files and no jobs."
        ),
        epilog="examples:\n  paddlecloud users delete bob\n  paddlecloud users delete bob --remove-home\n",
        aliases=["rm"],
    )
    delete.add_argument("name", metavar="NAME", help="the user to delete")
    add_flag(delete, "remove-home", action="store_true", help="remove the home instead of archiving it")

    limits = users.command(
        "quota",
        quota,
        help="show or change a user's quota",
        description=(
            "Show a user's quota, or change the limits given and keep the others. Quantities use\n"
            "Kubernetes syntax (4, 500m, 8Gi); 'unlimited' removes a limit."
        ),
        epilog=(
            "examples:\n"
            "  paddlecloud users quota bob\n"
            "  paddlecloud users quota bob -cpu 8 -gpu 1 -memory 32Gi -jobs 4 -storage 100Gi -disk 200Gi\n"
            "  paddlecloud users quota bob --gpu unlimited\n"
        ),
    )
    limits.add_argument("name", metavar="NAME", help="the user")
    suppress = argparse.SUPPRESS  # absent unless given: only given limits change
    add_flag(limits, "cpu", type=_quantity, default=suppress, metavar="Q", help="CPU cores, e.g. 8 or 500m")
    add_flag(limits, "gpu", type=_count, default=suppress, metavar="N", help="GPUs")
    add_flag(limits, "memory", type=_quantity, default=suppress, metavar="Q", help="memory, e.g. 32Gi")
    add_flag(limits, "jobs", type=_count, default=suppress, metavar="N", help="jobs running at once")
    add_flag(limits, "storage", type=_quantity, default=suppress, metavar="Q", help="PFS storage, e.g. 100Gi")
    add_flag(
        limits,
        "disk",
        type=_quantity,
        default=suppress,
        metavar="Q",
        help="scratch space of all running workers together (their -disk), e.g. 200Gi",
    )
