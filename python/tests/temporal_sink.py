"""Receipt digests the test workflows seal, passed through the workflow
sandbox so that a workflow replayed in the test process appends here too."""

from typing import List, Tuple

#: (workflow id, receipt digest), in the order the workflows sealed them.
SEALED: List[Tuple[str, str]] = []
