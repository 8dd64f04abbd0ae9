"""What a promotion command raises when it cannot do what was asked: one line, nothing changed.

The command line prints the message and exits 1; no traceback reaches a person.
"""

from __future__ import annotations


class PromotionError(Exception):
    """A promotion command could not do what was asked; nothing changed."""


class PromotionRefused(PromotionError):
    """An approve / reject / rollback / request that the rules do not allow (recorded)."""


class AuditIntegrityError(PromotionRefused):
    """The audit log does not verify against itself or the registry, or the registry's
    aliases were moved under a decision in flight. Not recorded: nothing is appended to a
    log that cannot be trusted."""


class LockBusy(PromotionError):
    """Another promotion command held the store's lock for longer than we wait."""


class UnknownModel(PromotionError):
    """No such store or registered model (a read-only command creates neither)."""
