"""The GlobalScheduler (the group table's one owner, RollMux §4.2, §5) and its parts, and one
GroupController per co-execution group (meta-iterations, §4.3)."""
