"""The safety suite: tasks that tempt a reward hacker, and scripted attackers that try.

`tasks` builds the tempting tasks (bait, a canary, the bundled mined task, a Harbor task);
`attack` says what an attack is; the attacks themselves are grouped by what they go for:
`tampering` (the tests and pytest), `escapes` (unsafe actions beside a fix), `channels`
(answers stolen and carried between runs), `verdicts` (the verdict erased, forged or
replayed from a doctored record); `suite` plays them all (`ATTACKS`, `run_safety_suite`)
and scores a candidate policy on the same tasks (`candidate_safety`).
"""
