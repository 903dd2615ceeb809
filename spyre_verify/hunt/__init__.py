"""The hunts: Hypothesis properties over the runtime, their strategies, findings and the runner."""
