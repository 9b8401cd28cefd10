"""Make a moto server enforce IAM, so that a bucket can really refuse ferry's writes
(tests/s3_outage.rs). boto3 comes with moto[server] (requirements-s3.txt).

    moto_iam.py ENDPOINT setup
        Creates IAM users `admin` (may do anything) and `ferry` (may do anything in S3), then
        turns on moto's authorization (POST /moto-api/reset-auth 0): from then on every request
        must be signed by a known key and be allowed by that user's policies. Prints
        {"admin": [key, secret], "ferry": [key, secret]}.
    moto_iam.py ENDPOINT deny-writes ADMIN_KEY ADMIN_SECRET
        Adds an explicit Deny of s3:PutObject to `ferry` (PutObject, UploadPart,
        Create/CompleteMultipartUpload are all s3:PutObject in IAM).
    moto_iam.py ENDPOINT allow-writes ADMIN_KEY ADMIN_SECRET
        Removes that Deny.
"""

import json
import sys
import urllib.request

import boto3


def iam(endpoint, key="testing", secret="testing"):
    return boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key, aws_secret_access_key=secret)


def user(client, name, policy):
    client.create_user(UserName=name)
    client.put_user_policy(UserName=name, PolicyName="base", PolicyDocument=json.dumps(policy))
    k = client.create_access_key(UserName=name)["AccessKey"]
    return [k["AccessKeyId"], k["SecretAccessKey"]]


def allow(action):
    return {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": action, "Resource": "*"}]}


def main():
    endpoint, cmd = sys.argv[1], sys.argv[2]
    if cmd == "setup":
        c = iam(endpoint)
        out = {"admin": user(c, "admin", allow("*")), "ferry": user(c, "ferry", allow("s3:*"))}
        req = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"})
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req) as r:
            assert r.status == 200, r.status
        print(json.dumps(out))
    elif cmd == "deny-writes":
        deny = {"Version": "2012-10-17", "Statement": [{"Effect": "Deny", "Action": "s3:PutObject", "Resource": "*"}]}
        iam(endpoint, sys.argv[3], sys.argv[4]).put_user_policy(UserName="ferry", PolicyName="deny-writes", PolicyDocument=json.dumps(deny))
        print(json.dumps({"ok": True}))
    elif cmd == "allow-writes":
        iam(endpoint, sys.argv[3], sys.argv[4]).delete_user_policy(UserName="ferry", PolicyName="deny-writes")
        print(json.dumps({"ok": True}))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
