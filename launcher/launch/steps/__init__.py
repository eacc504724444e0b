"""The step report: where each rank's optimizer steps spent their time, judged across the job, and its views."""
