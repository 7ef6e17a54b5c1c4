"""The kubernetes jobs backend: a namespace per user, parameter servers as a StatefulSet,
trainers as an Indexed Job, state followed with watches (docs/kubernetes.md)."""
