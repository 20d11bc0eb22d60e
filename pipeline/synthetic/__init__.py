"""Synthetic long-context tasks: pure builders (``tasks``) and the datatrove stage that runs them
(``stage``)."""
