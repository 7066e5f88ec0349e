"""Each rung's declared measurements (a `onboard.ladder.contract.Measurements` per rung), read without its runner."""
