"""The Firestore store: Google's client library, Firestore in Native mode."""
