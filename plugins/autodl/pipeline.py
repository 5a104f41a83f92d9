"""The six steps, now the :mod:`autodl.steps` package; kept so DAGs and callers importing ``autodl.pipeline`` keep working.

New code imports from the step's own module (``autodl.steps.<module>``).
"""

from autodl.steps import *  # noqa: F403 - the same public names, by design
from autodl.steps import __all__ as __all__
