"""The search's decisions: trials' statistics, the plan, the cost model, the tuner, the claim and
its reasons. No loader here: measurements come in through a function (the search run against
real loaders is child/tuning.py's)."""
