"""The deploy kit: ``deploy/deploy.py`` run from a checkout, or ``tasklease deploy`` (which
imports it from the installed package) for a project of your own."""
