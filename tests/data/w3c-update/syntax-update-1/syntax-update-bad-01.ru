# No URL
LOAD ;
