"""Mining tasks from a real repository's own bugs (`agentrl tasks mine`, SWE-smith's recipe).

`mine` runs it (`mine_repository`; the recipe in its docstring), `config` holds
`MineConfig` and the report, `layout` walks a repository, `baseline` sets it up and runs its
unmutated suite under a tracer, `candidates` finds the bugs to plant, `hidden_cases`
records the calls that tell a bug from its fix, `task_folder` writes a kept mutant as a task.
"""
