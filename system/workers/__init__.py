"""The worker roles: the loop every worker shares, and what one poll of each role does."""
