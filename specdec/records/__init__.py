"""What a run leaves behind: its counts and times (`stats`) and, when asked, every round traced
(`trace`)."""
