"""An example user's app: a welcome mail per signup, and a weekly digest per subscriber."""
