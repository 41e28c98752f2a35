"""The pack stage, pure: no I/O, no config files. ``plan.plan_two_tier`` decides which tier
each document goes to and makes the rows (``binpack`` packs lengths into bins, ``balance``
evens the attention cost of long rows); ``plan_config`` holds the planner's settings."""
