-- Issue 25 item 5: `lease_taken_over` fed only an accessor nobody read (`Lease::taken_over`);
-- whether a grant took the lease from a holder that never let go is `lease_takeovers` growing,
-- which the S3 store already uses. Old binaries wrote the column; nothing reads it any more.
ALTER TABLE uploads DROP COLUMN lease_taken_over;
