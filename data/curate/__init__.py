"""Dataset curation: composable steps from raw kernels and trajectories to training data.

Each step is a plain function ``step(dataset, ...) -> (dataset, StepReport)``; ``pipeline``
chains them from a recipe. Reports carry the counts in and out and one reason per removed
record, so every run says what it dropped and why.
"""
